"""Multi-stage pipelines: a model declares a graph of stages (its topology), a recipe places
them (processes, connectors per edge, timeouts), and the orchestrator runs requests through.

Importing this package imports no heavy library: engines, connectors and tensors are loaded
when a pipeline starts.
"""
