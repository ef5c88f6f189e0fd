"""Attachments: files in user messages, checked at submit, stored once, resolved by the worker.

A submit gathers every file (from `attachments=[…]` and from file parts in `messages`), checks each
against the agent's `accepted_media_types`, the size limits and the URL allowlist, and only then stores
the bytes: one Redis hash per turn (or per thread), one field per distinct file (its sha256), expiring
with its owner; a file above the Redis threshold goes to the object store (STEPQ_ATTACHMENT_STORE_URL).
The transcript holds the reference alone, so a 20 MB PDF is stored once (as base64) however many steps
the turn runs.
Just before each model call the worker reads the bytes back (or fetches an allowlisted URL) into a copy
of the transcript that lives only for that call.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import mimetypes
from dataclasses import dataclass, field
from importlib.util import find_spec
from os import PathLike
from pathlib import Path
from typing import Any
from urllib.error import URLError
from urllib.parse import unquote, urlsplit
from urllib.request import HTTPRedirectHandler, Request, build_opener

from stepq.config.settings import Settings
from stepq.errors import AttachmentError, StepqError, SubmitError
from stepq.models import SUPPORTED_TYPES as SUPPORTED_TYPES  # data, read by definitions too
from stepq.models import FilePart, Message, UserMessage

GCS_PROVIDERS = frozenset({"gemini"})  # providers that read a gs:// object themselves
# providers whose adapters send files (any other would drop them silently: refused at submit instead)
FILE_PROVIDERS = frozenset(
    {"anthropic", "anthropic-vertex", "gemini", "bedrock", "openai", "openai-compatible", "azure-openai"}
    | {"scripted", "function", "test"}
)
_FETCH_TIMEOUT_S = 30.0


@dataclass(frozen=True)
class Attachment:
    """One file for `Client.submit(..., attachments=[…])`: bytes, a local path, or a URL.

    `media_type` is guessed from the file name or URL when not given. An http(s) or s3:// URL is read
    by the worker and must match `STEPQ_ATTACHMENT_URL_ALLOW`; a `gs://` URL goes to Gemini as a file
    reference."""

    data: bytes | None = None
    path: str | PathLike[str] | None = None
    url: str | None = None
    media_type: str | None = None
    name: str | None = None

    @classmethod
    def from_bytes(cls, data: bytes, media_type: str, name: str | None = None) -> Attachment:
        return cls(data=data, media_type=media_type, name=name)

    @classmethod
    def from_path(cls, path: str | PathLike[str], media_type: str | None = None) -> Attachment:
        return cls(path=path, media_type=media_type)

    @classmethod
    def from_url(cls, url: str, media_type: str | None = None, name: str | None = None) -> Attachment:
        return cls(url=url, media_type=media_type, name=name)

    def to_part(self, max_bytes: int) -> FilePart:
        """The file part this attachment becomes (bytes ride base64 until submit stores them)."""
        given = [x for x in (self.data, self.path, self.url) if x is not None]
        if len(given) != 1:
            raise AttachmentError("an Attachment takes exactly one of data=, path= or url=")
        name = self.name
        data = self.data
        if self.path is not None:
            path = Path(self.path)
            name = name or path.name
            try:
                size = path.stat().st_size
                if size > max_bytes:
                    raise AttachmentError(
                        f"attachment {path.name} is {size} bytes; the limit is {max_bytes} (STEPQ_ATTACHMENT_MAX_BYTES)"
                    )
                data = path.read_bytes()
            except OSError as exc:
                raise AttachmentError(f"cannot read attachment {self.path}: {exc.strerror or exc}") from None
        if data is not None and not isinstance(data, bytes | bytearray):
            raise AttachmentError(f"Attachment data must be bytes, not {type(data).__name__}")
        media_type = self.media_type or _guess(name or self.url or "")
        if not media_type:
            raise AttachmentError(f"cannot tell the media type of attachment {name or self.url!r}; pass media_type=")
        if data is not None:
            return FilePart(media_type=media_type, data=base64.b64encode(data).decode(), name=name)
        return FilePart(media_type=media_type, url=self.url, name=name)


def _guess(name: str) -> str | None:
    guessed, _ = mimetypes.guess_type(urlsplit(name).path if "://" in name else name)
    return guessed


def attach(messages: list[Message], attachments: list[Any] | None, settings: Settings) -> None:
    """Add `attachments` to the last user message (the prompt's)."""
    if not attachments:
        return
    if not isinstance(attachments, list):
        raise AttachmentError(f"attachments must be a list of Attachment, not {type(attachments).__name__}")
    users = [m for m in messages if isinstance(m, UserMessage)]
    if not users:
        raise AttachmentError("attachments go with a user message; the messages have none")
    for item in attachments:
        if not isinstance(item, Attachment):
            raise AttachmentError(f"attachments must be Attachment objects, not {type(item).__name__}")
        users[-1].files.append(item.to_part(settings.attachment_max_bytes))


@dataclass
class Pending:
    """A submit's files, checked but not stored yet: base64 by attachment id (for Redis), and bytes by
    s3:// URI (files above STEPQ_ATTACHMENT_REDIS_MAX_BYTES, for the object store)."""

    stored: dict[str, str] = field(default_factory=dict)
    objects: dict[str, bytes] = field(default_factory=dict)


def prepare(
    messages: list[Message],
    settings: Settings,
    agent_id: str,
    accepted: list[str],
    provider: str,
    options: dict[str, Any] | None = None,
) -> Pending:
    """Check every file part and turn inline data into references (in place). Raises SubmitError naming
    the first refused file; nothing has been stored then. `options`: the agent's provider_options."""
    pending = Pending()
    total = 0
    for message in messages:
        if not isinstance(message, UserMessage):
            continue
        for part in message.files:
            label = part.name or part.url or part.media_type
            media_type = part.media_type.strip().lower()
            part.media_type = media_type
            _check_type(media_type, label, agent_id, accepted)
            if provider not in FILE_PROVIDERS:
                raise AttachmentError(
                    f"agent {agent_id} runs on {provider}, which stepq cannot send files to yet; "
                    f"files go to {', '.join(sorted(FILE_PROVIDERS))}"
                )
            _check_provider_type(provider, media_type, label, agent_id, options or {})
            if part.attachment_id is not None:
                raise AttachmentError(
                    f"file {label!r} has an attachment_id, which stepq assigns; send the file again as data or url"
                )
            if (part.data is None) == (part.url is None):
                raise AttachmentError(f"file {label!r} needs exactly one of data (base64 or a data: URL) or url")
            if part.url is not None:
                check_url(part.url, settings, provider)
                continue
            raw = _decode(part.data or "", label, media_type)
            size = len(raw)
            if size > settings.attachment_max_bytes:
                raise AttachmentError(
                    f"attachment {label!r} is {size} bytes; the limit is {settings.attachment_max_bytes} "
                    "(STEPQ_ATTACHMENT_MAX_BYTES)"
                )
            store = settings.attachment_store_url
            if size > settings.attachment_redis_max_bytes and not store:
                raise AttachmentError(
                    f"attachment {label!r} is {size} bytes, above STEPQ_ATTACHMENT_REDIS_MAX_BYTES "
                    f"({settings.attachment_redis_max_bytes}), and no object store is configured "
                    "(STEPQ_ATTACHMENT_STORE_URL); send a smaller file or a URL the worker may fetch"
                )
            attachment_id = hashlib.sha256(raw).hexdigest()
            if attachment_id not in pending.stored and not any(u.endswith(attachment_id) for u in pending.objects):
                total += size
            if total > settings.attachment_turn_max_bytes:
                raise AttachmentError(
                    f"the turn's attachments total {total} bytes; the limit is {settings.attachment_turn_max_bytes} "
                    "(STEPQ_ATTACHMENT_TURN_MAX_BYTES)"
                )
            if size > settings.attachment_redis_max_bytes and store:
                if find_spec("boto3") is None:
                    raise AttachmentError(
                        "STEPQ_ATTACHMENT_STORE_URL needs boto3; install it (pip install 'stepq[bedrock]')"
                    )
                uri = f"{store.rstrip('/')}/{attachment_id}"
                pending.objects[uri] = raw
                part.data, part.url, part.size = None, uri, size
            else:
                pending.stored[attachment_id] = base64.b64encode(raw).decode()
                part.data, part.attachment_id, part.size = None, attachment_id, size
    return pending


def _check_type(media_type: str, label: str, agent_id: str, accepted: list[str]) -> None:
    if media_type not in SUPPORTED_TYPES:
        raise AttachmentError(
            f"file {label!r} is {media_type}, which stepq does not carry; supported: {', '.join(sorted(SUPPORTED_TYPES))}",
            unsupported_type=True,
        )
    family = media_type.split("/")[0] + "/*"
    if media_type not in accepted and family not in accepted:
        shown = ", ".join(accepted) or "none"
        raise AttachmentError(
            f"agent {agent_id} does not accept {media_type} files (accepted: {shown}); "
            "list the type in the agent's accepted_media_types",
            unsupported_type=True,
        )


def _check_provider_type(provider: str, media_type: str, label: str, agent_id: str, options: dict[str, Any]) -> None:
    """Most OpenAI-compatible servers refuse Chat Completions' PDF `file` part (OpenAI's own extension): a PDF
    goes to one only when the agent says its server takes them (provider_options file_parts)."""
    if provider != "openai-compatible" or media_type != "application/pdf":
        return
    if str(options.get("api", "chat")) == "chat" and not options.get("file_parts"):
        raise AttachmentError(
            f"file {label!r} is application/pdf, which agent {agent_id} cannot send to its OpenAI-compatible server "
            "over Chat Completions; set provider_options file_parts=true if the server takes OpenAI file parts",
            unsupported_type=True,
        )


def _decode(data: str, label: str, media_type: str) -> bytes:
    if data.startswith("data:"):
        header, sep, data = data.partition(",")
        if not sep or not header.endswith(";base64"):
            raise AttachmentError(f"file {label!r}: a data: URL must be base64 (data:{media_type};base64,...)")
    try:
        return base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise AttachmentError(f"file {label!r}: data is not valid base64") from None


def check_url(url: str, settings: Settings, provider: str, stored_by_us: bool = False) -> None:
    """Refuse a URL no worker may fetch: not on STEPQ_ATTACHMENT_URL_ALLOW, or gs:// for a provider other
    than Gemini (which reads the object itself). `stored_by_us`: the worker's check, which also lets
    through stepq's own object store (a caller may not name objects there)."""
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme == "gs":
        if provider not in GCS_PROVIDERS:
            raise AttachmentError(f"{url}: a gs:// file reaches only Gemini, and this turn runs on {provider}")
        return
    if scheme not in ("http", "https", "s3") or not parts.hostname:
        raise AttachmentError(
            f"{url}: attachment URLs are http(s) or s3:// on STEPQ_ATTACHMENT_URL_ALLOW, or gs:// for Gemini"
        )
    if scheme == "s3" and find_spec("boto3") is None:
        raise AttachmentError(f"{url}: s3:// files are read with boto3; install it (pip install 'stepq[bedrock]')")
    allow = [*settings.attachment_url_allow]
    if stored_by_us and settings.attachment_store_url:
        allow.append(settings.attachment_store_url.rstrip("/") + "/")
    if not any(_allowed(parts, entry) for entry in allow):
        raise AttachmentError(f"{url} is not on STEPQ_ATTACHMENT_URL_ALLOW; add its scheme://host[/path] prefix there")


def _allowed(url: Any, entry: str) -> bool:
    allow = urlsplit(entry)
    try:
        same_port = (url.port or _default_port(url.scheme)) == (allow.port or _default_port(allow.scheme))
    except ValueError:
        return False
    return (
        url.scheme.lower() == allow.scheme.lower()
        and (url.hostname or "") == (allow.hostname or "").lower()
        and same_port
        and _under(url.path, allow.path or "/")
    )


def _under(path: str, prefix: str) -> bool:
    """`path` lies under the allowlisted `prefix`, segment by segment: a `..` or `.` segment (also
    percent-encoded) or an encoded slash could leave the prefix once the server decodes the path, so any is
    refused, and `/files` does not admit `/files-private`."""
    decoded = unquote(path)
    if "\\" in decoded or decoded.count("/") != path.count("/"):
        return False  # an encoded slash or a backslash: the server may split segments differently
    segments = decoded.split("/")
    if any(segment in (".", "..") for segment in segments):
        return False
    wanted = [segment for segment in prefix.split("/")]
    if wanted and wanted[-1] == "":
        wanted = wanted[:-1]  # "/files/" names the folder, as "/files" does
    return segments[: len(wanted)] == wanted and (len(segments) > len(wanted) or path == prefix)


def _default_port(scheme: str) -> int:
    return 443 if scheme.lower() == "https" else 80


# --------------------------------------------------------------------------- the worker side


class AttachmentMissingError(StepqError):
    """A referenced file is gone (expired with its turn) or could not be fetched."""


def resolve(
    messages: list[Message], load: Any, settings: Settings, provider: str, cache: dict[str, bytes] | None = None
) -> list[Message]:
    """A copy of the transcript whose file parts carry their bytes (base64 `data`) for one provider call.

    `load(attachment_id)` returns the stored base64 or None. The transcript itself is left as it is."""
    out: list[Message] = []
    for message in messages:
        if not isinstance(message, UserMessage) or not message.files:
            out.append(message)
            continue
        files = [_resolved(part, load, settings, provider, cache) for part in message.files]
        out.append(message.model_copy(update={"files": files}))
    return out


def _resolved(part: FilePart, load: Any, settings: Settings, provider: str, cache: dict[str, bytes] | None) -> FilePart:
    if part.attachment_id is not None:
        stored = load(part.attachment_id)
        if stored is None:
            raise AttachmentMissingError(f"attachment {part.name or part.attachment_id} is no longer stored")
        return part.model_copy(update={"data": stored})
    if part.url is not None and urlsplit(part.url).scheme.lower() == "gs":
        return part  # the provider reads it
    if part.url is not None:
        raw = cache.get(part.url) if cache is not None else None
        if raw is None:
            raw = fetch(part.url, settings, provider)
            if cache is not None:
                cache[part.url] = raw
    else:
        return part
    return part.model_copy(update={"data": base64.b64encode(raw).decode()})


def fetch(url: str, settings: Settings, provider: str) -> bytes:
    """An allowlisted URL's bytes (checked again here: the allowlist may have changed since submit)."""
    try:
        check_url(url, settings, provider, stored_by_us=True)
    except SubmitError as exc:
        raise AttachmentMissingError(str(exc)) from None
    limit = settings.attachment_max_bytes
    if urlsplit(url).scheme.lower() == "s3":
        return _fetch_s3(url, limit)
    try:
        with _OPENER.open(Request(url), timeout=_FETCH_TIMEOUT_S) as response:
            body = response.read(limit + 1)
    except URLError as exc:  # HTTPError included: a redirect or an error status
        raise AttachmentMissingError(f"fetching {url} failed: {getattr(exc, 'code', None) or exc.reason}") from None
    except OSError as exc:
        raise AttachmentMissingError(f"fetching {url} failed: {type(exc).__name__}") from None
    if len(body) > limit:
        raise AttachmentMissingError(f"{url} is larger than {limit} bytes (STEPQ_ATTACHMENT_MAX_BYTES)")
    return bytes(body)


def upload(objects: dict[str, bytes]) -> None:
    """Put files above the Redis threshold into the object store (content-addressed: a repeat is harmless).
    Give the store's prefix a lifecycle rule: these objects do not expire with their turn by themselves."""
    if not objects:
        return
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    client = boto3.client("s3")
    for uri, raw in objects.items():
        parts = urlsplit(uri)
        try:
            client.put_object(Bucket=parts.netloc, Key=parts.path.lstrip("/"), Body=raw)
        except ClientError as exc:
            code = exc.response.get("Error", {}).get("Code", "error")
            raise AttachmentError(f"storing a file in {uri} failed: {code}") from None
        except BotoCoreError as exc:
            raise AttachmentError(f"storing a file in {uri} failed: {type(exc).__name__}") from None


def _fetch_s3(url: str, limit: int) -> bytes:
    """An s3:// object through boto3, with the worker's AWS credentials (its standard chain)."""
    import boto3
    from botocore.exceptions import BotoCoreError, ClientError

    parts = urlsplit(url)
    try:
        found = boto3.client("s3").get_object(Bucket=parts.netloc, Key=parts.path.lstrip("/"))
        if int(found.get("ContentLength") or 0) > limit:
            found["Body"].close()
            raise AttachmentMissingError(f"{url} is larger than {limit} bytes (STEPQ_ATTACHMENT_MAX_BYTES)")
        return bytes(found["Body"].read())
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code", "error")
        raise AttachmentMissingError(f"fetching {url} failed: {code}") from None
    except BotoCoreError as exc:
        raise AttachmentMissingError(f"fetching {url} failed: {type(exc).__name__}") from None


class _NoRedirect(HTTPRedirectHandler):
    """A redirect could leave the allowlist: it is an error, not followed."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = build_opener(_NoRedirect())
