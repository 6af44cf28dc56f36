"""The toy study of issue 11 in one place: its arms, its protocols and the runner's time estimates.

An arm is a recipe under test. Its flags are `tapa train` flags (every config field is one):
- `pretrain`: the model and optimizer flags of pretraining at the protocol's length;
- `continual`: added to `pretrain` for the continual stage (argparse keeps the last value of a
  repeated flag, so `--pe rope-yarn` here overrides the `--pe rope` of `pretrain`);
- `eval_pe`: evaluate the weights under another RoPE rule (`tapa eval --eval-pe`), e.g. eval-time
  YaRN; None evaluates the model as trained;
- `eval_temperature`: evaluate the weights with the global layers' log-length query temperature at
  the protocol's pretraining length (`tapa eval --eval-query-temperature`), a model trained
  without it;
- `zero_shot`: whether the arm has a zero-shot evaluation of its own. RoPE continued with YaRN
  starts from the RoPE pretraining, so its zero-shot numbers are the RoPE arm's.
- `continual_lr_scale`: the continual stage's peak lr over the pretraining one for this arm; None
  takes the protocol's (plan.continual_scale).
- `convert`: `tapa convert` flags applied to the pretrained run before the continual stage, which
  then starts from the converted model (a retrofit: a RoPE model made a hybrid). The continual
  flags must then name the converted model's settings (they are checked against it).
Arms with equal `pretrain` flags share one pretraining run (at the same lr and seed), and arms with
equal `pretrain` + `continual` flags and `continual_lr_scale` share the continual run too; the
runner never trains twice.

Families group arms for the learning-rate sweep: each family sweeps its first arm (SWEEP_ARM) at
the protocol's lrs with one seed, and every arm of the family then runs its seeds at the family's
best lr.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from lab.study.aggregate import protocol_fingerprint

# the TAPA recipe under test (issue 11): the phase rows of W_q, W_k learn at 0.1x the lr
PHASE_LR = ["--phase-lr-scale", "0.1"]
HYBRID = ["--layer-pattern", "LLLG", "--local-window", "256"]  # 3 local RoPE layers, 1 global
# YaRN from the pretraining length to the continual one (4 = 2048 / 512 in the toy protocol);
# {names} are Protocol fields or `scale` (continual_len / pretrain_len), filled in by plan.py
YARN_CONTINUAL = ["--pe", "rope-yarn", "--rope-scale", "{scale}", "--original-seq-len", "{pretrain_len}"]


@dataclass(frozen=True)
class Arm:
    name: str
    label: str
    family: str
    pretrain: tuple = ()
    continual: tuple = ()
    eval_pe: str | None = None
    eval_temperature: bool = False
    zero_shot: bool = True
    continual_lr_scale: float | None = None
    convert: tuple = ()


GLOBAL_KINDS = {"tapa": ("--pe", "tapa", *PHASE_LR), "nope": ("--pe", "nope")}


def ratio_pattern(n_layers: int, every: int) -> str:
    """A layer pattern over all `n_layers` with one global layer in `every`: round(n_layers / every)
    of them (at least one), the last layer global and the others every `every` layers back from it,
    as the base hybrid has them (LLLG over 8 layers: LLLGLLLG)."""
    if n_layers < 1 or every < 1:
        raise ValueError(f"n_layers and every must be positive, not {n_layers} and {every}")
    count = max(1, round(n_layers / every))
    spots = {n_layers - 1 - every * i for i in range(count)}
    return "".join("G" if i in spots else "L" for i in range(n_layers))


# the LLG ratio lever's label and model flags ({...}: filled per protocol by plan._fill)
LLG_LABEL = "LLG ratio ({llg_pattern}: {llg_globals} of {n_layers} layers global)"
LLG_MODEL = ("--layer-pattern", "{llg_pattern}", "--local-window", "256")
# the log-length query temperature of the global layers, with its base at the pretraining length
TEMPERATURE = ("--query-temperature-base", "{pretrain_len}")


def _globals_screen() -> list:
    """The screen's arms: local window 64 and 128, the log-length query temperature (base at the
    pretraining length), the layer ratio (LLG's and LLLLLG's, written out over the protocol's
    layers), the continual stage's passkey share 0.1, for TAPA and NoPE globals; TAPA's theta
    0.25 / 0.75 and alpha 0.05 / 0.2 in its globals, and theta 0.75 with pk10 or at LLG."""
    arms = []
    for kind, pe in GLOBAL_KINDS.items():
        name, label = f"hybrid-{kind}", f"{kind.upper() if kind == 'tapa' else 'NoPE'} hybrid"
        levers = [
            ("w64", "window 64", ("--layer-pattern", "LLLG", "--local-window", "64"), ()),
            ("w128", "window 128", ("--layer-pattern", "LLLG", "--local-window", "128"), ()),
            ("temp", "query temperature", (*HYBRID, *TEMPERATURE), ()),
            # the query temperature moved both kinds most on seed 0 (2026-12-06): with the lever
            # that raised NoPE's single-key retrieval next most (window 128), and with TAPA's best
            # three-seed ratio (LLG)
            ("temp-w128", "query temperature, window 128",
             ("--layer-pattern", "LLLG", "--local-window", "128", *TEMPERATURE), ()),
            ("temp-llg", f"query temperature, {LLG_LABEL}", (*LLG_MODEL, *TEMPERATURE), ()),
            # the ratio levers, written out over the protocol's layers (ratio_pattern): a short
            # pattern repeats from layer 0, so "LLG" over the toy's 8 layers would be LLGLLGLL, the
            # last two layers local. 8 layers: LGLLGLLG and LLLLLLLG; 12: LLGLLGLLGLLG, LLLLLGLLLLLG
            ("llg", LLG_LABEL, LLG_MODEL, ()),
            ("l5g", "LLLLLG ratio ({l5g_pattern}: {l5g_globals} of {n_layers} layers global)",
             ("--layer-pattern", "{l5g_pattern}", "--local-window", "256"), ()),
            ("pk10", "continual passkey 0.1", HYBRID, ("--passkey-fraction", "0.1")),
        ]
        if kind == "tapa":
            levers += [(f"theta{t[2:]}", f"theta {t}", (*HYBRID, "--theta", t), ())
                       for t in ("0.25", "0.75")]
            levers += [(f"alpha{a[2:]}", f"alpha {a}", (*HYBRID, "--alpha", a), ())
                       for a in ("0.05", "0.2")]
            # the screen's first lead (2026-12-05, seed 0): theta 0.75 retrieved best of the TAPA
            # arms at the 2% passkey share, NoPE's pk10 best of all; the two together (shares
            # theta75's pretraining run)
            levers.append(("theta75-pk10", "theta 0.75, continual passkey 0.1",
                           (*HYBRID, "--theta", "0.75"), ("--passkey-fraction", "0.1")))
            # the two levers that each lowered TAPA's far perplexity on seed 0 (2026-12-06), together
            levers.append(("theta75-llg", f"theta 0.75, {LLG_LABEL}",
                           (*LLG_MODEL, "--theta", "0.75"), ()))
        for tag, what, model, continual in levers:
            # in the base hybrid arms' order (--pe, model, then TAPA's phase lr), so that an arm
            # with the base model (pk10) shares their pretraining run
            arms.append(Arm(f"{name}-{tag}", f"{label}, {what}", "hybrid", (*pe[:2], *model, *pe[2:]),
                            continual=continual, zero_shot=not continual))
            if tag == "temp":
                # the temperature at evaluation only, on the base arm's runs: how much of the lever
                # needs no training (pretraining at 512 applies it to one position in 512)
                arms.append(Arm(f"{name}-evaltemp", f"{label}, query temperature at evaluation only",
                                "hybrid", (*pe[:2], *HYBRID, *pe[2:]), eval_temperature=True))
    return arms


ARMS = {arm.name: arm for arm in (
    Arm("rope", "RoPE", "rope", ("--pe", "rope")),
    Arm("rope-yarn", "RoPE, continued with YaRN (s=4)", "rope", ("--pe", "rope"),
        continual=tuple(YARN_CONTINUAL), zero_shot=False),
    Arm("rope-eval-yarn", "RoPE + eval-time YaRN", "rope", ("--pe", "rope"), eval_pe="rope-yarn"),
    # the other eval-time RoPE scalings users compare against (added 2026-12-01): each reads the
    # RoPE arm's runs, with the factor set to each evaluation length over the training length
    Arm("rope-eval-pi", "RoPE + eval-time PI", "rope", ("--pe", "rope"), eval_pe="rope-pi"),
    Arm("rope-eval-ntk", "RoPE + eval-time NTK", "rope", ("--pe", "rope"), eval_pe="rope-ntk"),
    Arm("nope", "NoPE", "nope", ("--pe", "nope")),
    Arm("tapa", "TAPA", "tapa", ("--pe", "tapa", *PHASE_LR)),
    Arm("tapa-theta75", "TAPA, theta 0.75", "tapa", ("--pe", "tapa", "--theta", "0.75", *PHASE_LR)),
    Arm("tapa-linear", "TAPA, linear phase", "tapa", ("--pe", "tapa-linear-phase", *PHASE_LR)),
    Arm("hybrid-tapa", "TAPA hybrid (LLLG, w256)", "hybrid", ("--pe", "tapa", *HYBRID, *PHASE_LR)),
    # the passkey lead of 2026-12-01: at continual lr x0.1 the TAPA globals' phase rows learn at 1% of
    # the pretraining peak, and the TAPA hybrid barely learned passkey retrieval; here they learn
    # at the continual lr itself (same pretraining run as hybrid-tapa)
    Arm("hybrid-tapa-cphase", "TAPA hybrid (LLLG, w256), continual phase rows at 1x", "hybrid",
        ("--pe", "tapa", *HYBRID, *PHASE_LR), continual=("--phase-lr-scale", "1.0"), zero_shot=False),
    # the passkey question of 2026-12-01: at continual lr x0.1 the TAPA hybrid retrieved 18/17/12/13%
    # (phase rows 0.1x) or 45/31/24/20% (phase rows 1x, cphase), at x1 90/89/84/75%; x0.3 is between
    # (same pretraining run as hybrid-tapa)
    Arm("hybrid-tapa-clr03", "TAPA hybrid (LLLG, w256), continual lr x0.3, phase rows 1x", "hybrid",
        ("--pe", "tapa", *HYBRID, *PHASE_LR), continual=("--phase-lr-scale", "1.0"),
        continual_lr_scale=0.3, zero_shot=False),
    Arm("hybrid-nope", "NoPE hybrid (LLLG, w256)", "hybrid", ("--pe", "nope", *HYBRID)),
    Arm("hybrid-rope", "RoPE hybrid (LLLG, w256)", "hybrid", ("--pe", "rope", *HYBRID)),
    Arm("hybrid-rope-eval-yarn", "RoPE hybrid (LLLG, w256) + eval-time YaRN", "hybrid",
        ("--pe", "rope", *HYBRID), eval_pe="rope-yarn"),
    # controls for hybrid-tapa-clr03 (2026-12-01: x0.3 raised the TAPA hybrid's retrieval on both
    # seeds, 66/58/56/41% against 50/38/30/19% at x0.1): is the gain TAPA's or the lr's? The same
    # x0.3 stage for the RoPE hybrid (read with eval-time YaRN, its better form) and for RoPE
    # continued with YaRN; each shares its owner's pretraining run
    Arm("hybrid-rope-eval-yarn-clr03", "RoPE hybrid (LLLG, w256) + eval-time YaRN, continual lr x0.3",
        "hybrid", ("--pe", "rope", *HYBRID), eval_pe="rope-yarn", zero_shot=False,
        continual_lr_scale=0.3),
    Arm("rope-yarn-clr03", "RoPE, continued with YaRN (s=4), continual lr x0.3", "rope",
        ("--pe", "rope"), continual=tuple(YARN_CONTINUAL), zero_shot=False, continual_lr_scale=0.3),
    # issue 37's screen: what should the hybrid's global layers be? Each lever on both global kinds
    # (TAPA and NoPE), against hybrid-tapa and hybrid-nope; the continual stage at 4096 is the
    # protocol toy-gpu-c4096 on the same arms
    *_globals_screen(),
    # issue 35's question: does training on packed rows with document masking (no token attends
    # across a document, in pretraining and the continual stage) change length or passkey?
    # Against hybrid-tapa and rope, which train on rows that cross documents
    Arm("hybrid-tapa-docmask", "TAPA hybrid (LLLG, w256), document masking", "hybrid",
        ("--pe", "tapa", *HYBRID, *PHASE_LR, "--doc-mask")),
    Arm("rope-docmask", "RoPE, document masking", "rope", ("--pe", "rope", "--doc-mask")),
    # issue 38's retrofit: the RoPE arm's pretrained model converted to the LLLG hybrid (local
    # layers keep its RoPE weights, the globals become TAPA or NoPE), then the continual stage;
    # against the hybrids trained from scratch (hybrid-tapa, hybrid-nope) and RoPE + YaRN. The
    # phase rows start at 0.1x, as the models' own init and the toy recipe have it.
    # The first run (2026-12-05, seed 0) left both retrofits flat but 11-26% above RoPE + YaRN to 32x,
    # and no better at 2048 than at 512: at x0.1 the converted global layers did not learn to use the
    # longer context. The -clr03 and -clr1 arms run the same stage at x0.3 and x1 the pretraining lr.
    *[Arm(f"retrofit-{kind}{tag}", f"RoPE retrofitted to the {'TAPA' if kind == 'tapa' else 'NoPE'} "
          f"hybrid (LLLG, w256){what}", "rope", ("--pe", "rope"), zero_shot=False,
          convert=(*HYBRID, "--pe", kind, "--phase-init-scale", "0.1"),
          continual=(*HYBRID, "--pe", kind, "--phase-init-scale", "0.1",
                     *(PHASE_LR if kind == "tapa" else ())), continual_lr_scale=scale)
      for kind in ("tapa", "nope")
      for tag, what, scale in (("", "", None), ("-clr03", ", continual lr x0.3", 0.3),
                               ("-clr1", ", continual lr x1", 1.0))],
)}
FAMILIES = ("rope", "nope", "tapa", "hybrid")
SWEEP_ARM = {"rope": "rope", "nope": "nope", "tapa": "tapa", "hybrid": "hybrid-tapa"}
# theory: logit moments vs distance of the pretrained model's middle global layer on held-out text
# (python3 -m tapa.theory.trained), for the arm that owns the pretraining run
# domain0/domain1: perplexity on the protocol's second text domain (Protocol.domain), zero-shot and
# after the continual stage
STAGES = ("pretrain", "eval0", "domain0", "continual", "eval1", "domain1", "passkey", "theory")
DOMAIN_STAGES = ("domain0", "domain1")


def screen_plan() -> list[tuple[str, str]]:
    """Issue 37's screen as (protocol, arm): the two base arms, each lever's TAPA arm and its NoPE
    twin in turn, TAPA's own settings, then the continual stage at 4096 on both base arms."""
    screen = [arm.name for arm in _globals_screen()]
    plan = [("toy-gpu-screen", f"hybrid-{kind}") for kind in GLOBAL_KINDS]
    for name in (n for n in screen if n.startswith("hybrid-tapa-")):
        twin = name.replace("hybrid-tapa-", "hybrid-nope-", 1)
        plan += [("toy-gpu-screen", n) for n in (name, twin) if n in screen]
    plan += [("toy-gpu-c4096", f"hybrid-{kind}") for kind in GLOBAL_KINDS]
    return plan


def screen_queue() -> list[tuple[str, str, int]]:
    """Every planned job of issue 37's screen as (protocol, arm, seed), in the order they should
    run (a caller skips those already run): first the seeds that a lever's seed 0 calls for, then
    seed 0 of each arm in `screen_plan`'s order, then the other arms' seeds 1-2.
    Reordered by hand as results come in; results/toy-study/globals/README.md says why."""
    screen, kinds = "toy-gpu-screen", list(GLOBAL_KINDS)
    # 2026-12-06, seed 0: the query temperature lowered 16k perplexity 6-8% for both kinds and
    # lifted NoPE's single-key retrieval at 4k from 26% to 76%, the most of any lever: is it real?
    # (Run the same day: the perplexity held on every seed; the retrieval, 49% on the mean, less.)
    first = [(screen, f"hybrid-{kind}-temp", seed) for seed in (1, 2) for kind in kinds]
    # 2026-12-07, seed 0: the temperature at the LLG ratio kept TAPA's perplexity under the
    # temperature and more than doubled its multi-key retrieval beyond the window (41% at 8k against
    # 17%), past NoPE with the temperature (27%): NoPE under the same levers, then both kinds' seeds
    first += [(screen, "hybrid-nope-temp-llg", 0)]
    first += [(screen, f"hybrid-{kind}-temp-llg", seed) for seed in (1, 2) for kind in kinds]
    seed0 = [(protocol, arm, 0) for protocol, arm in screen_plan()]
    # 2026-12-07, seed 0: the temperature with window 128 gave NoPE the screen's best multi-key.
    # Window 128 alone and theta 0.75 at LLG get no more seeds: each is worse in 16k perplexity and
    # in multi-key retrieval than its kind's arm with the temperature added (the numbers:
    # results/toy-study/globals/README.md, What remains, item 1)
    later = [(screen, f"hybrid-{kind}-temp-w128", seed) for seed in (1, 2) for kind in kinds]
    return list(dict.fromkeys(first + seed0 + later))


# issue 37's confirmation at the scale step: the screen's best configurations of each global kind
# (reordered by hand as the screen's seeds come in; results/toy-study/globals/README.md says why),
# then the anchors the issue names. Two a kind: the temperature, and the temperature with window
# 128 (2026-12-07, three seeds of each kind: at the temperature's perplexity within the spread, it
# retrieves more on the means for both kinds at every length, and TAPA's worst seed no longer
# retrieves nothing). It replaced the temperature at the LLG ratio before the confirmation ran it:
# at 30M that pair is within the spread of window 128's, higher at 16k on TAPA's mean and lower in
# every retrieval task on NoPE's. The LLG ratio alone (both kinds) and theta 0.75 left earlier, for
# the same reasons against the temperature
CONFIRM_CANDIDATES = ("hybrid-nope-temp", "hybrid-tapa-temp", "hybrid-tapa-temp-w128", "hybrid-nope-temp-w128")
CONFIRM_ANCHORS = ("hybrid-tapa", "hybrid-nope", "rope-yarn")


def confirm_plan() -> list[tuple[str, str]]:
    """The confirmation as (protocol, arm): the candidates, then the anchors."""
    return [("scale-768-confirm", arm) for arm in (*CONFIRM_CANDIDATES, *CONFIRM_ANCHORS)]


# The confirmation runs every seed of every candidate first, seed by seed. The goal's table reads
# only arms with three seeds, so the candidates' seeds come before the anchors' seeds 1-2 (2026-12-07,
# after the temperature's three seeds of each kind and the anchors' seed 0 had run: the anchors'
# seed 0 already reads RoPE + YaRN's length and the temperature's gain within this protocol, and
# their 2026-12-02 runs under the plain scale step have more seeds: the bases 3, RoPE + YaRN 2);
# then the anchors' seeds, each seed led by RoPE + YaRN, the goal's length anchor, then the two bases
# (RoPE + YaRN's seed 0 here moved 0.8-2.7% from its 2026-12-02 run, the size of the temperature's
# gain against the 12-02 bases)
CONFIRM_LEAD = ("rope-yarn", "hybrid-nope", "hybrid-tapa")


def confirm_queue() -> list[tuple[str, str, int]]:
    """The confirmation's jobs as (protocol, arm, seed) in run order: seeds 0-2 of CONFIRM_CANDIDATES,
    seed by seed, then seed 0 of every other arm (CONFIRM_LEAD's before the others), then seeds 1,
    then seeds 2."""
    plan = {arm: protocol for protocol, arm in confirm_plan()}
    first = [(plan[arm], arm, seed) for seed in (0, 1, 2) for arm in CONFIRM_CANDIDATES]
    order = [(plan[arm], arm) for arm in dict.fromkeys((*CONFIRM_LEAD, *plan))]
    rest = [(protocol, arm, seed) for seed in (0, 1, 2) for protocol, arm in order]
    return list(dict.fromkeys(first + rest))


def stages_of(protocol) -> list[str]:
    """Every stage a job of this protocol can have (the domain stages need its second domain)."""
    return [s for s in STAGES if protocol.domain or s not in DOMAIN_STAGES]


@dataclass(frozen=True)
class Protocol:
    """Everything a job's commands share. `tokens` counts training tokens per stage."""

    name: str
    recipe: str
    device: str
    data: tuple  # data flags, identical for `tapa train --data-only` and every run
    model: tuple = ()  # model flags added to every arm's (a scale step changes these)
    pretrain_len: int = 512
    pretrain_batch: int = 64
    pretrain_steps: int = 3052  # 3052 x 64 x 512 = 100.0M tokens
    pretrain_flags: tuple = ("--warmup-steps", "100", "--eval-every", "1000", "--eval-batches", "8",
                             "--save-every", "250", "--log-every", "50")
    continual_len: int = 2048
    continual_batch: int = 16
    continual_steps: int = 153  # 153 x 16 x 2048 = 5.01M tokens, 5% of pretraining
    continual_flags: tuple = ("--warmup-steps", "15", "--eval-every", "0", "--eval-batches", "4",
                              "--save-every", "0", "--log-every", "10", "--passkey-fraction", "0.02")
    # the continual stage's peak lr over the pretraining one. It starts from the weights alone, with
    # a fresh AdamW state, whose first steps move every weight by about the lr: at x1 (the first
    # continual runs, 2026-12-01) the loss jumped from 1.61 to 2.43 in 10 steps and every arm ended
    # ~13% worse at 512 than zero-shot. x0.1 continues at the lr where pretraining's cosine ended
    # (min_lr_ratio 0.1).
    continual_lr_scale: float = 0.1
    eval_lengths: tuple = (512, 1024, 2048, 4096, 8192, 16384)
    eval_stride: int = 256
    eval_tokens: int = 65536  # scored tokens per length
    passkey_lengths: tuple = (2048, 4096, 8192, 16384)  # 1x, 2x, 4x, 8x the continual length
    passkey_depths: tuple = (0.0, 0.25, 0.5, 0.75, 1.0)
    passkey_trials: int = 50
    # the retrieval suite (`tapa eval --tasks`) in the passkey stage, on the passkey's lengths and
    # depths; empty: passkey only. task_trials None: tapa eval's default (+-5 points a length)
    retrieval_tasks: tuple = ()
    task_trials: int | None = None
    # a second text domain for perplexity (lab.study.domain builds it where the study runs; the
    # stages domain0 and domain1 evaluate on it with the evaluation's lengths); None: none
    domain: str | None = None
    theory_len: int = 4096  # 8x the pretraining length: distances past training
    theory_sequences: int = 8
    sweep_lrs: tuple = (5e-4, 1e-3, 2e-3)
    seeds: tuple = (0, 1, 2)
    # scheduling only: training tokens/s relative to the toy model's (Estimates.tokens_per_s)
    rate_scale: float = 1.0

    @property
    def pretrain_tokens(self) -> int:
        return self.pretrain_steps * self.pretrain_batch * self.pretrain_len

    @property
    def continual_tokens(self) -> int:
        return self.continual_steps * self.continual_batch * self.continual_len

    def to_dict(self) -> dict:
        values = dataclasses.asdict(self)
        values.update(pretrain_tokens=self.pretrain_tokens, continual_tokens=self.continual_tokens)
        return values

    @property
    def n_layers(self) -> int:
        """The model's layer count: the protocol's --n-layers, else its recipe's."""
        flags = list(self.model)
        if "--n-layers" in flags:
            return int(flags[flags.index("--n-layers") + 1])
        from tapa.model import ModelConfig
        from tapa.train.config import load_recipe

        return int(load_recipe(self.recipe)["model"].get("n_layers", ModelConfig.n_layers))

    def fingerprint(self) -> str:
        """Short hash of what the training and evaluation numbers depend on: jobs with equal
        fingerprints are comparable (the name, the plan's lrs and seeds and the theory settings
        are left out)."""
        return protocol_fingerprint(self.to_dict())


TOY_GPU = Protocol(
    name="toy-gpu", recipe="toy-gpu", device="cuda",
    # builtin stdlib + site-packages Python (the recipe's), capped at 450 MB: >= 100M tokens if the
    # machine has that much text; the runner reports the count from the corpus manifest
    data=("--max-train-bytes", "400000000", "--tokenizer-train-bytes", "50000000"))

# The scale step: dim 768, 12 layers, head_dim 128, one seed. 2500 pretraining steps (81.9M
# tokens) are the most each of its four groups fits in one call (results/toy-study/compile-probe.md);
# the continual stage stays the toy's (5.0M tokens at 2048, 6% of this pretraining).
# rate_scale: the scale model's eager training rate over the toy TAPA model's, 384k / 779k tokens/s
# (lab/study/gpu_compile_probe.sh, 2026-12-02).
SCALE_768 = dataclasses.replace(TOY_GPU, name="scale-768",
                                model=("--dim", "768", "--n-layers", "12", "--n-heads", "6"),
                                pretrain_steps=2500, rate_scale=0.49)

# issue 37's screen: toy-gpu with the retrieval suite after the continual stage, perplexity on a
# second domain (prose: the installed packages' READMEs), and its lever "the continual stage at
# 4096" (the same tokens at twice the length)
TOY_GPU_SCREEN = dataclasses.replace(TOY_GPU, name="toy-gpu-screen", retrieval_tasks=("all",),
                                     domain="package-docs")
TOY_GPU_C4096 = dataclasses.replace(TOY_GPU_SCREEN, name="toy-gpu-c4096", continual_len=4096,
                                    continual_batch=8)
# issue 38's retrofit, the lever its first run points to: a continual stage 4x as long, 612 x 16 x
# 2048 = 20.05M tokens, 20% of pretraining (the arms' own lr scale and flags unchanged)
TOY_GPU_CL20 = dataclasses.replace(TOY_GPU_SCREEN, name="toy-gpu-cl20", continual_steps=612)
# issue 37's confirmation: the scale step (91M, 12 layers) with the screen's evaluations (the
# retrieval suite, the second domain), for its 3 seeds of the screen's best arms and of the
# existing hybrid-tapa, hybrid-nope and rope-yarn arms (the scale-768 runs of 2026-12-02 had
# neither evaluation). The ratio levers' patterns follow its 12 layers (ratio_pattern).
SCALE_768_CONFIRM = dataclasses.replace(SCALE_768, name="scale-768-confirm", retrieval_tasks=("all",),
                                        domain="package-docs")

# Seconds-long CPU version of every stage, for tests and a dry run of the machinery.
TINY_CPU = Protocol(
    name="tiny-cpu", recipe="tiny", device="cpu",
    data=("--vocab-size", "300", "--max-train-bytes", "200000", "--val-fraction", "0.004",
          "--test-fraction", "0.004"),
    model=("--dim", "32", "--n-layers", "4", "--n-heads", "2"),  # 4 layers: LLLG has a global one
    pretrain_len=32, pretrain_batch=4, pretrain_steps=4,
    pretrain_flags=("--warmup-steps", "1", "--eval-every", "0", "--eval-batches", "1",
                    "--save-every", "0", "--log-every", "1", "--no-plot"),
    continual_len=256, continual_batch=2, continual_steps=2,
    continual_flags=("--warmup-steps", "1", "--eval-every", "0", "--eval-batches", "1",
                     "--save-every", "0", "--log-every", "1", "--passkey-fraction", "0.5",
                     "--no-plot"),
    eval_lengths=(32, 128), eval_stride=32, eval_tokens=128,
    passkey_lengths=(256, 512), passkey_depths=(0.0, 1.0), passkey_trials=2,
    theory_len=128, theory_sequences=2,
    sweep_lrs=(1e-3, 3e-3), seeds=(0, 1))

# the screen's machinery on CPU: the retrieval suite (two tasks, one trial a cell) and the second
# domain
TINY_CPU_SCREEN = dataclasses.replace(TINY_CPU, name="tiny-cpu-screen",
                                      retrieval_tasks=("single-key", "multi-key"), task_trials=1,
                                      passkey_lengths=(512, 1024), domain="package-docs")

PROTOCOLS = {p.name: p for p in (TOY_GPU, TOY_GPU_SCREEN, TOY_GPU_C4096, TOY_GPU_CL20, SCALE_768,
                                 SCALE_768_CONFIRM, TINY_CPU,
                                 TINY_CPU_SCREEN)}


@dataclass
class Estimates:
    """What the runner assumes before this call has measured anything (then it uses what it saw).

    tokens_per_s: one training process alone on an H200 at L=512, over a whole stage (its
    validation passes and checkpoints included). The runner logs' progress lines read ~690k
    tokens/s for the NoPE hybrid and ~715k for TAPA (2026-12-01; results/toy-study/calls at commit
    2dda4ca); whole pretraining stages ran at 560-620k for the hybrids.
    speedup: total throughput of N processes sharing the GPU over one alone, measured the same day:
    2 processes ~640-670k tokens/s together, 4 processes ~610-680k. Processes time-slice the GPU
    (no MPS), so sharing buys nothing: run one at a time (--concurrent 1), which also finishes jobs
    sooner and loses less at a call's end.
    """

    # Calibrated 2026-12-01 on the stage times of the job JSONs since 10:00 UTC (`wall_seconds`, 23
    # jobs): pretraining 100M tokens took 166-179 s for the hybrids and TAPA (136 s NoPE); the
    # 5M-token continual stage 11-20 s; per evaluated rule, an evaluation 9-10 s at the median (18 s
    # the first of a call), a passkey grid 13.6 s (25 s max), theory 6 s (27 s max). The estimates
    # sit above the medians, and hold the slowest pretraining, so that the runner never starts a
    # group it cannot finish; before this they were 25/25/15 s at 700k tokens/s, 20 s startup, and
    # the groups ran in 0.72-0.81x of them.
    tokens_per_s: float = 600_000.0
    speedup: dict = field(default_factory=lambda: {1: 1.0, 2: 0.95, 3: 0.93, 4: 0.92})
    startup_s: float = 10.0  # per training stage: imports, CUDA context, Triton compiles, corpus
    eval_s_per_method: float = 14.0  # 6 lengths x 64k scored tokens, up to 16k windows
    passkey_s_per_method: float = 18.0  # 4 lengths x 5 depths x 50 trials, up to 16k prompts
    theory_s: float = 12.0  # load, 8 x 4096 tokens through one layer, binning, iid samples
    # a retrieval-suite prompt: the suite's 6,160 prompts (4 tasks x 4 lengths (2k-16k) x 5 depths
    # x 77) took 44-54 s on the screen's first five arms (2026-12-05, one H200; the grids' recorded
    # `seconds`, every depth of a length batched up to 256k tokens), 0.007-0.009 s a prompt; its
    # first run, a cell at a time in 16k-token batches, had taken more than 0.033 s
    task_s_per_prompt: float = 0.009
    # fresh machine: BPE on 50 MB + tokenizing ~400 MB (64 s, then 77 s twice, 53 s with the
    # batched encoder), then the kernels' preflight (15 s): 68 s on 2026-12-01 21:58 UTC
    data_build_s: float = 80.0
    # a retrofit's conversion: 9 s and 3 s on 2026-12-05. The first continual stage from a converted
    # folder then spent ~280 s tokenizing the corpus again with the folder's re-serialized copy of the
    # tokenizer; since 4d4abf7 the copy is the run's own file and the cache reuses its entry
    convert_s: float = 15.0

    # the evaluation times that run the model: slower by the same factor as its training
    MODEL_TIMES = ("eval_s_per_method", "passkey_s_per_method", "task_s_per_prompt", "theory_s")

    def process_rate(self, concurrent: int) -> float:
        speedup = self.speedup.get(concurrent, max(self.speedup.values()))
        return self.tokens_per_s * speedup / concurrent

    def for_model_rate(self, rate_scale: float) -> Estimates:
        """These estimates for a model that trains at rate_scale times the toy's tokens/s (a
        protocol's `rate_scale`): training and every time in MODEL_TIMES scale with it."""
        return dataclasses.replace(self, tokens_per_s=self.tokens_per_s * rate_scale,
                                   **{name: getattr(self, name) / rate_scale for name in self.MODEL_TIMES})


TINY_ESTIMATES = Estimates(tokens_per_s=5_000.0, speedup={1: 1.0, 2: 1.0}, startup_s=3.0,
                           eval_s_per_method=1.0, passkey_s_per_method=1.0, theory_s=1.0,
                           task_s_per_prompt=0.01,
                           data_build_s=2.0)
