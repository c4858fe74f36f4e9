"""inference: the embedded CPU engine (see ``inference/README.md``).

Modules: ``config`` (ModelConfig from config.json), ``weights`` (safetensors loading and the
weights digest), ``rope``, ``cache`` (SequenceCache), ``attention``, ``invariant``
(batch-invariant matmuls), ``self_test`` (the start-up probe that picks one), ``model``
(DecoderModel),
``tokenizer`` (ChatTokenizer), ``tool_prompt`` (tools for templates without them),
``gguf_file`` and ``checkpoint`` (GGUF files and model folders), ``pull`` (the default
model, hash-pinned), ``forbidden_text``, ``make_model`` (the random tiny model for tests)
and ``cli``.

Nothing is imported here: ``inference.cli`` must stay importable without torch.
"""
