"""omni on Intel GPUs: the ``xpu`` platform. Importing this package is cheap: it imports no torch."""
