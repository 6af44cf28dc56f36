"""transformers integration: `TapaConfig` and `TapaForCausalLM`, registered with AutoConfig and
AutoModelForCausalLM under model type "tapa-llama" when this package is imported.

A saved model also loads without importing tapa first:
AutoModelForCausalLM.from_pretrained(path, trust_remote_code=True) runs the small modules that
save_pretrained writes next to config.json, which import the installed tapa package.
"""

from tapa._optional import require

require("transformers")

from transformers import AutoConfig, AutoModelForCausalLM  # noqa: E402

from tapa.hf.configuration import MODEL_TYPE, TapaConfig  # noqa: E402
from tapa.hf.modeling import TapaForCausalLM  # noqa: E402

AutoConfig.register(MODEL_TYPE, TapaConfig, exist_ok=True)
AutoModelForCausalLM.register(TapaConfig, TapaForCausalLM, exist_ok=True)

__all__ = ["TapaConfig", "TapaForCausalLM", "MODEL_TYPE"]
