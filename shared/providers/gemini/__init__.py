"""Google Gemini (AI Studio and Vertex AI) through google-genai (`adapter`), request building (`wire`), the
JSON schema subset Gemini takes (`schema`), error classification (`errors`) and batch mode (`batch`).

Importing the package imports no SDK: the registry imports `adapter` on first use.
"""
