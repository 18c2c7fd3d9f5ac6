from omni_core.declared import *  # noqa: F403
