"""The engine runtime, loaded once per process: model config, weights, tokenizer, the hot-path
contract, the build loader, hot reload and the continuous-batching scheduler.

It knows nothing about experiments, HTTP serving or sandboxes (the layers above it).
"""
