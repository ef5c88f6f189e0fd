"""OpenAI (Responses API), Azure OpenAI and OpenAI-compatible servers through the official SDK (`adapter`),
the stream parser (`stream`) and request building (`wire`).

Importing the package imports no SDK: the registry imports `adapter` on first use.
"""
