pytest_plugins = ["omni_core.testing"]
