"""Bedrock batch inference (`bedrock` `create_model_invocation_job`, S3 in and out): the `bedrock` provider's
batch API, for Anthropic Claude models.

Batch inference takes each model's native InvokeModel body, not Converse: for Claude that is the Anthropic
Messages body (`anthropic_wire.build_params` with `anthropic_version`), and each answer is an Anthropic
`Message`, mapped by the Anthropic batch path. The requests go to `<bucket>/<batch id>/input.jsonl`
(`{recordId, modelInput}` per line), the job (named after stepq's batch id, which is also its
`clientRequestToken`, so a resubmitted job is the same job) writes `<bucket>/<batch id>/out/<job id>/
input.jsonl.out`. The bucket and the role Bedrock assumes come from STEPQ_BEDROCK_BATCH_BUCKET and
STEPQ_BEDROCK_BATCH_ROLE_ARN; without them (or for a non-Claude model) Bedrock steps run online.
"""

from __future__ import annotations

import json
import os
from typing import Any

import boto3
import botocore.config
import botocore.exceptions

from stepq.models import StepOutput
from stepq.providers.anthropic.batch import message_output
from stepq.providers.anthropic.wire import build_params
from stepq.providers.base import BatchAPI, BatchState, ProviderError, StepRequest
from stepq.providers.bedrock.errors import classify_exception  # the streamed path's classification
from stepq.providers.errors import classify_status

ENDED = frozenset({"Completed", "PartiallyCompleted", "Failed", "Stopped", "Expired"})
ANTHROPIC_VERSION = "bedrock-2023-05-31"
BUCKET_VAR, ROLE_VAR = "STEPQ_BEDROCK_BATCH_BUCKET", "STEPQ_BEDROCK_BATCH_ROLE_ARN"


def configured(model: str) -> bool:
    return "anthropic." in model and bool(os.environ.get(BUCKET_VAR)) and bool(os.environ.get(ROLE_VAR))


def _split(url: str) -> tuple[str, str]:
    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    return bucket, prefix.strip("/")


def invoke_body(request: StepRequest) -> dict[str, Any]:
    """The InvokeModel body of one step: the Anthropic Messages body as Bedrock takes it. Like the Converse
    adapter, it carries temperature and top_p (Bedrock's Claude bodies take them) and no effort or strict."""
    body = build_params(request)
    for name in ("model", "extra_headers", "output_config"):
        body.pop(name, None)
    for tool in body.get("tools", []):
        tool.pop("strict", None)
    if request.temperature is not None:
        body["temperature"] = request.temperature
    if request.sampling("top_p") is not None:
        body["top_p"] = request.sampling("top_p")
    body["anthropic_version"] = ANTHROPIC_VERSION
    return body


class BedrockBatchAPI(BatchAPI):
    def __init__(self, model: str, region: str | None) -> None:
        self.model = model
        self.bucket, self.prefix = _split(os.environ[BUCKET_VAR])
        self.role = os.environ[ROLE_VAR]
        self.config = botocore.config.Config(region_name=region, retries={"total_max_attempts": 1, "mode": "standard"})

    def _client(self, service: str) -> Any:
        session: Any = boto3.session.Session()
        return session.client(service, config=self.config)

    def _key(self, *parts: str) -> str:
        return "/".join(p for p in (self.prefix, *parts) if p)

    def _call(self, fn: Any) -> Any:
        try:
            return fn()
        except ProviderError:
            raise
        except Exception as exc:
            raise classify_exception(exc, 60.0) from exc

    def submit(self, local_id: str, requests: list[tuple[str, StepRequest]]) -> str:
        lines = []
        for custom, request in requests:
            body = invoke_body(request)
            lines.append(json.dumps({"recordId": custom, "modelInput": body}, separators=(",", ":")))
        key = self._key(local_id, "input.jsonl")
        s3 = self._client("s3")
        self._call(lambda: s3.put_object(Bucket=self.bucket, Key=key, Body=("\n".join(lines) + "\n").encode()))
        job = self._call(
            lambda: self._client("bedrock").create_model_invocation_job(
                jobName=local_id.replace("_", "-"),
                clientRequestToken=local_id,
                roleArn=self.role,
                modelId=self.model,
                inputDataConfig={"s3InputDataConfig": {"s3Uri": f"s3://{self.bucket}/{key}", "s3InputFormat": "JSONL"}},
                outputDataConfig={"s3OutputDataConfig": {"s3Uri": f"s3://{self.bucket}/{self._key(local_id, 'out')}/"}},
            )
        )
        return str(job["jobArn"])

    def poll(self, batch_id: str) -> BatchState:
        job = self._call(lambda: self._client("bedrock").get_model_invocation_job(jobIdentifier=batch_id))
        return "ended" if job.get("status") in ENDED else "in_progress"

    def results(self, batch_id: str) -> dict[str, StepOutput | ProviderError]:
        job = self._call(lambda: self._client("bedrock").get_model_invocation_job(jobIdentifier=batch_id))
        out_bucket, out_prefix = _split(job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"])
        in_name = job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"].rsplit("/", 1)[-1]
        key = "/".join(p for p in (out_prefix, batch_id.rsplit("/", 1)[-1], f"{in_name}.out") if p)
        s3 = self._client("s3")
        try:
            body = s3.get_object(Bucket=out_bucket, Key=key)["Body"].read().decode()
        except botocore.exceptions.ClientError:
            return {}  # a job that failed as a whole wrote nothing: its steps run online
        answers: dict[str, StepOutput | ProviderError] = {}
        for line in body.splitlines():
            if not line.strip():
                continue
            record = json.loads(line)
            custom = record.get("recordId")
            if not custom:
                continue
            if isinstance(record.get("modelOutput"), dict):
                answers[custom] = message_output(record["modelOutput"])
            elif isinstance(record.get("error"), dict):
                error = record["error"]
                code = int(error.get("errorCode") or 500)
                answers[custom] = classify_status(
                    code, f"Bedrock batch record failed ({code}): {error.get('errorMessage', '')}", code=str(code)
                )
        return answers

    def cancel(self, batch_id: str) -> None:
        self._call(lambda: self._client("bedrock").stop_model_invocation_job(jobIdentifier=batch_id))
