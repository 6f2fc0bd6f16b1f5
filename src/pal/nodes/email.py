"""`email`: an SMTP delivery (smtplib), claimed in side_effect_receipts before sending.

The message's Message-ID and an Idempotency-Key header derive from the step attempt's key, so a
receiver that de-duplicates (`idempotentReceiver: true`) recognises a re-send. The server is
PAL_SMTP_URL; the sender is `from` or PAL_SMTP_FROM.

The SMTP server is the operator's PAL_SMTP_URL, trusted configuration that no graph field can
change, so the egress guard (pal.core.egress) does not apply to it (docs/side-effects.md). What a graph
does choose are the addresses: each `to` item must be exactly one address, so a comma, a semicolon
or a CR/LF inside an item cannot add a recipient or a header.
"""

from __future__ import annotations

import asyncio
import email.policy
import functools
import os
import smtplib
from collections.abc import Coroutine, Mapping
from concurrent.futures import ThreadPoolExecutor
from email import errors
from email.headerregistry import Address, AddressHeader, HeaderRegistry
from email.message import EmailMessage
from typing import Any, ClassVar

from pal.config import smtp_address
from pal.core import egress, templates
from pal.errors import DeliveryError, DeliveryOutcomeUnknown, DeliveryTimeout
from pal.nodes.base import Field, NodeKind, StepContext, run_to_end
from pal.nodes.delivery import delivery

_HEADERS = HeaderRegistry()
SMTP_SENDER_THREADS = 8


def one_address(text: str) -> Address | str:
    """`text` as exactly one e-mail address, or why it is not one."""
    if any(ord(c) < 32 or c == "\x7f" for c in text):
        return "holds a control character (CR, LF, NUL, …)"
    try:
        parsed = _HEADERS("to", text)
    except Exception as exc:  # the parser raises on some malformed input (`a@`)
        return f"cannot be parsed ({type(exc).__name__})"
    if not isinstance(parsed, AddressHeader):  # the registry makes "to" an address header
        return "cannot be parsed as an address"
    # A non-ASCII local part is allowed (RFC 6532: smtplib sends it with SMTPUTF8); no other defect.
    defects = [d for d in parsed.defects if not isinstance(d, errors.NonASCIILocalPartDefect)]
    if defects:
        return f"is not one well-formed address ({defects[0]})"
    if any(group.display_name is not None for group in parsed.groups):
        return "is a group of addresses, not one address"
    addresses = parsed.addresses
    if len(addresses) != 1:
        return f"holds {len(addresses)} addresses, not one"
    address = addresses[0]
    if not address.username or not address.domain:
        return "is not user@domain"
    if address.domain.startswith("[") or egress.is_address_literal(address.domain):
        # a@[127.0.0.1] makes the SMTP server deliver to a host the graph picks, internal ones too
        return f"names a host by IP address ({address.domain}), not a domain name"
    return address


class Email(NodeKind):
    type_name = "email"
    gateable: ClassVar[bool] = True  # the confidence gate may stand before its effect
    fields: ClassVar[Mapping[str, Field]] = {
        "to": Field((str, list), required=True),
        "subject": Field((str,), required=True),
        "body": Field((str,), required=True),
        "from": Field((str,)),
        "idempotentReceiver": Field((bool,), templated=False),
        "label": Field((str,), templated=False),
    }

    def validate(self, data: Mapping[str, Any], known_tools: frozenset[str] | None) -> list[str]:
        problems = super().validate(data, known_tools)
        to = data.get("to")
        for field, items in (("to", to if isinstance(to, list) else [to]), ("from", [data.get("from")])):
            for item in items:  # a template is checked once rendered, in execute
                if isinstance(item, str) and not templates.has_template(item):
                    problem = one_address(item)
                    if isinstance(problem, str):
                        problems.append(f"{field!r} {'item ' if field == 'to' else ''}{item!r} {problem}")
        return problems

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        return run_to_end(self.awaitable(data, ctx))

    def awaitable(self, data: Mapping[str, Any], ctx: StepContext) -> Coroutine[Any, Any, Any]:
        """Check the addresses, form the message and claim the receipt here; the SMTP exchange
        runs on one of a few sender threads (smtplib blocks), awaited, so it holds no worker."""
        services = ctx.need_services()
        to = ctx.render(data["to"])
        items = [str(r) for r in (to if isinstance(to, list) else [to])]
        if not items:
            raise DeliveryError(f"email: 'to' rendered to {to!r}, not e-mail addresses")
        parsed: list[Address] = []
        for item in items:
            address = one_address(item)
            if isinstance(address, str):
                raise DeliveryError(f"email: 'to' rendered to {to!r}, not e-mail addresses: "
                                    f"{item!r} {address} (nothing was sent)")
            parsed.append(address)
        sender_text = str(ctx.render(data.get("from") or services.setting("smtp_from")))
        sender = one_address(sender_text)
        if isinstance(sender, str):
            raise DeliveryError(f"email: 'from' {sender_text!r} {sender} (nothing was sent)")
        # The envelope is the parsed addresses, not a re-parse of the headers by smtplib: what is
        # checked here is exactly who receives the message.
        recipients, envelope_from = [a.addr_spec for a in parsed], sender.addr_spec
        # 998 is SMTP's own line limit: the long Message-ID stays on one line, easy to match on.
        message = EmailMessage(policy=email.policy.SMTP.clone(max_line_length=998))
        try:
            message["From"] = sender
            message["To"] = parsed
            message["Subject"] = str(ctx.render(data["subject"]))
            message["Message-ID"] = f"<{ctx.idempotency_key}@pal>"
            message["Idempotency-Key"] = ctx.idempotency_key
            message.set_content(str(ctx.render(data["body"])))
        except ValueError as exc:  # e.g. a CR/LF in the subject: no header may be injected
            raise DeliveryError(f"email: cannot form the message: {exc} (nothing was sent)") from exc
        host, port = smtp_address(services.setting("smtp_url"))
        timeout = float(services.setting("delivery_timeout"))

        def exchange() -> dict[str, Any]:
            try:
                with smtplib.SMTP(host, port, timeout=timeout) as smtp:
                    refused = smtp.send_message(message, from_addr=envelope_from, to_addrs=recipients)
            except TimeoutError as exc:
                raise DeliveryTimeout(f"email via {host}:{port}: timed out after {timeout:g}s") from exc
            except (ConnectionRefusedError, smtplib.SMTPConnectError) as exc:
                raise DeliveryError(f"email via {host}:{port}: cannot connect: {exc}") from exc
            except smtplib.SMTPRecipientsRefused as exc:
                raise DeliveryError(f"email via {host}:{port}: every recipient refused") from exc
            except (smtplib.SMTPException, OSError) as exc:
                raise DeliveryOutcomeUnknown(f"email via {host}:{port}: {type(exc).__name__}: {exc}") from exc
            return {"message_id": message["Message-ID"], "recipients": recipients,
                    "refused": sorted(refused)}

        async def send() -> dict[str, Any]:
            return await asyncio.get_running_loop().run_in_executor(_senders(os.getpid()), exchange)

        return delivery(ctx, "email", ", ".join(recipients), bool(data.get("idempotentReceiver")), send)


@functools.cache
def _senders(pid: int) -> ThreadPoolExecutor:
    """The threads process `pid`'s SMTP exchanges run on (a forked child makes its own): a few,
    as e-mail steps are few and an SMTP server limits the connections one client may open."""
    return ThreadPoolExecutor(SMTP_SENDER_THREADS, thread_name_prefix="pal-smtp")
