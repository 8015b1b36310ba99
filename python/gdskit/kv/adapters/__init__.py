"""Inference-engine adapters over the KV block store (gdskit.kv.BlockStore), one module per engine:

    gdskit.kv.adapters.vllm      GdskitOffloadingSpec   vLLM OffloadingConnector (spec_name/spec_module_path)
    gdskit.kv.adapters.lmcache   GdskitL2Client         LMCache native_plugin L2 adapter (module_path/class_name)
    gdskit.kv.adapters.sglang    GdskitHiCacheStorage   SGLang HiCache dynamic storage backend

Each module imports without its engine installed; with the engine installed it subclasses the engine's own base
classes. Configuration for each engine, the interface versions followed and what was tested are in
docs/kv-adapters.md.
"""
