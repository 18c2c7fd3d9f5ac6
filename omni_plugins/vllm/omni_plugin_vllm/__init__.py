"""omni-plugin-vllm: vLLM as a stage engine for omni's pipelines (``[[stage_engine]]`` ``vllm``).

:mod:`omni_plugin_vllm.engine` holds :class:`~omni_plugin_vllm.engine.VllmStageEngine`;
:mod:`omni_plugin_vllm.probe` answers, without importing vLLM, whether it can run an
architecture here. Importing this package imports neither vLLM nor torch."""
