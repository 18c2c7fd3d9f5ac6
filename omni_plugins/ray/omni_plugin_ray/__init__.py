"""omni's ``ray`` executor: each pipeline stage placed ``ray`` runs in a Ray actor of its own.

Nothing here imports Ray until a stage is launched: discovery, ``omni explain pipeline`` and
recipe validation stay light. See ``docs/ray.md`` and :mod:`omni_plugin_ray.executor`.
"""
