"""inference: the embedded CPU engine (see ``inference/README.md``).

Modules: ``config`` (ModelConfig from config.json), ``weights`` (safetensors loading and the
weights digest), ``rope``, ``cache`` (SequenceCache), ``attention``, ``invariant``
(batch-invariant matmuls and the start-up self-test), ``model`` (DecoderModel),
``tokenizer`` (ChatTokenizer), ``make_model`` (the shipped tiny model) and ``cli``.

Nothing is imported here: ``inference.cli`` must stay importable without torch.
"""
