"""A local stand-in for Bedrock's batch inference control plane (`bedrock` CreateModelInvocationJob,
GetModelInvocationJob, StopModelInvocationJob: REST-JSON, the real SDK's wire format), reading each job's
input from and writing its output to S3 through boto3 (in the tests, a moto S3 server).

A job answers every record from the reply queue at create (Anthropic replies from
tests/fakes/anthropic_server.py: a stream becomes the `modelOutput` Message, an ErrorReply an `error`
record) and reports `InProgress` until it is ended (at once on a get while `jobs_end` is set)."""

from __future__ import annotations

import json
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler
from typing import Any

import boto3

from tests.fakes.anthropic_server import ErrorReply, SSEReply, assemble
from tests.fakes.scripted_http import ScriptedHTTPServer


class FakeBedrockBatch(ScriptedHTTPServer[Any, dict[str, Any]]):
    name = "fake Bedrock batch"

    def __init__(self) -> None:
        super().__init__(_handler_for(self))
        self.jobs: dict[str, dict[str, Any]] = {}
        self.outputs: dict[str, bytes] = {}  # job arn -> the output file, written when the job ends
        self.jobs_end = True
        self.stopped: list[str] = []

    def end_jobs(self) -> None:
        for arn, job in self.jobs.items():
            if job["status"] == "InProgress":
                self._write_output(arn, job)
                job["status"] = "Completed"

    def _write_output(self, arn: str, job: dict[str, Any]) -> None:
        bucket, _, prefix = job["outputDataConfig"]["s3OutputDataConfig"]["s3Uri"].removeprefix("s3://").partition("/")
        name = job["inputDataConfig"]["s3InputDataConfig"]["s3Uri"].rsplit("/", 1)[-1]
        key = f"{prefix.rstrip('/')}/{arn.rsplit('/', 1)[-1]}/{name}.out"
        boto3.client("s3").put_object(Bucket=bucket, Key=key, Body=self.outputs[arn])


def _records(fake: FakeBedrockBatch, uri: str) -> bytes:
    bucket, _, key = uri.removeprefix("s3://").partition("/")
    body = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read().decode()
    out = []
    for line in body.splitlines():
        record = json.loads(line)
        reply = fake.pop_reply()
        row: dict[str, Any] = {"recordId": record["recordId"], "modelInput": record["modelInput"]}
        if isinstance(reply, SSEReply):
            row["modelOutput"] = assemble(reply.events)
        else:
            err = reply if isinstance(reply, ErrorReply) else ErrorReply(400, "x", "no scripted reply left")
            row["error"] = {"errorCode": err.status, "errorMessage": err.message}
        out.append(json.dumps(row))
    return ("\n".join(out) + "\n").encode()


def _handler_for(fake: FakeBedrockBatch) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            fake.add_request({"method": "POST", "path": self.path, "body": body})
            path = urllib.parse.unquote(self.path.split("?")[0])
            if path.endswith("/stop"):
                arn = path.removeprefix("/model-invocation-job/").removesuffix("/stop")
                fake.stopped.append(arn)
                fake.jobs[arn]["status"] = "Stopped"
                self._json({})
                return
            token = body.get("clientRequestToken")
            for arn, job in fake.jobs.items():  # the same token is the same job
                if token and job.get("clientRequestToken") == token:
                    self._json({"jobArn": arn})
                    return
            arn = f"arn:aws:bedrock:us-east-1:123456789012:model-invocation-job/{uuid.uuid4().hex[:12]}"
            fake.outputs[arn] = _records(fake, body["inputDataConfig"]["s3InputDataConfig"]["s3Uri"])
            fake.jobs[arn] = {**body, "jobArn": arn, "status": "InProgress", "submitTime": time.time()}
            self._json({"jobArn": arn})

        def do_GET(self) -> None:
            fake.add_request({"method": "GET", "path": self.path, "body": {}})
            arn = urllib.parse.unquote(self.path.split("?")[0].removeprefix("/model-invocation-job/"))
            job = fake.jobs.get(arn)
            if job is None:
                self._json({"message": f"no job {arn}"}, 404, "ResourceNotFoundException")
                return
            if fake.jobs_end:
                fake.end_jobs()
            self._json({k: job[k] for k in ("jobArn", "jobName", "modelId", "roleArn", "status", "submitTime",
                                             "inputDataConfig", "outputDataConfig")})  # fmt: skip

        def _json(self, payload: dict[str, Any], status: int = 200, error_type: str = "") -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if error_type:
                self.send_header("x-amzn-ErrorType", error_type)
            self.end_headers()
            self.wfile.write(data)

    return Handler
