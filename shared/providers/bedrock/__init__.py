"""Amazon Bedrock: the Converse API through boto3 (`adapter`), request building and error classification
(`wire`), and batch inference over S3 (`batch`).

Importing the package imports no SDK: the registry imports `adapter` on first use.
"""
