"""Anthropic: the Messages API through the official SDK (`adapter`), its stream parser (`stream`), request
building (`wire`), Message Batches (`batch`) and Claude on Vertex AI (`vertex`).

Importing the package imports no SDK: the registry imports `adapter` on first use.
"""
