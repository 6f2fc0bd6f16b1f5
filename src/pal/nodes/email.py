"""`email`: an SMTP delivery (smtplib), claimed in side_effect_receipts before sending.

The message's Message-ID and an Idempotency-Key header derive from the step attempt's key, so a
receiver that de-duplicates (`idempotentReceiver: true`) recognises a re-send. The server is
PAL_SMTP_URL; the sender is `from` or PAL_SMTP_FROM.
"""

from __future__ import annotations

import email.policy
import smtplib
from collections.abc import Mapping
from email.message import EmailMessage
from typing import Any, ClassVar

from pal.config import smtp_address
from pal.errors import DeliveryError, DeliveryOutcomeUnknown, DeliveryTimeout
from pal.nodes.base import Field, NodeKind, StepContext
from pal.nodes.delivery import deliver


class Email(NodeKind):
    type_name = "email"
    fields: ClassVar[Mapping[str, Field]] = {
        "to": Field((str, list), required=True),
        "subject": Field((str,), required=True),
        "body": Field((str,), required=True),
        "from": Field((str,)),
        "idempotentReceiver": Field((bool,), templated=False),
        "label": Field((str,), templated=False),
    }

    def execute(self, data: Mapping[str, Any], ctx: StepContext) -> Any:
        services = ctx.need_services()
        to = ctx.render(data["to"])
        recipients = [str(r) for r in (to if isinstance(to, list) else [to])]
        if not recipients or not all("@" in r for r in recipients):
            raise DeliveryError(f"email: 'to' rendered to {to!r}, not e-mail addresses")
        # 998 is SMTP's own line limit: the long Message-ID stays on one line, easy to match on.
        message = EmailMessage(policy=email.policy.SMTP.clone(max_line_length=998))
        message["From"] = str(ctx.render(data.get("from") or services.setting("smtp_from")))
        message["To"] = ", ".join(recipients)
        message["Subject"] = str(ctx.render(data["subject"]))
        message["Message-ID"] = f"<{ctx.idempotency_key}@pal>"
        message["Idempotency-Key"] = ctx.idempotency_key
        message.set_content(str(ctx.render(data["body"])))
        host, port = smtp_address(services.setting("smtp_url"))
        timeout = float(services.setting("delivery_timeout"))

        def send() -> dict[str, Any]:
            try:
                with smtplib.SMTP(host, port, timeout=timeout) as smtp:
                    refused = smtp.send_message(message)
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

        return deliver(ctx, "email", ", ".join(recipients), bool(data.get("idempotentReceiver")), send)
