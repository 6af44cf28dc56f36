"""Positional encodings around attention: the attention kinds (`tapa.positional.kinds`, the
registry every layer reads) and the RoPE family (`tapa.positional.rope`)."""
