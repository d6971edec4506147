"""`draftgen.redact`: what is redacted, what is left alone."""

from __future__ import annotations

import logging
import secrets

import pytest

from draftgen.redact import (
    RedactingFilter,
    keep_header_secrets,
    keep_secret,
    keep_url_secrets,
    redact,
    redact_value,
)


@pytest.mark.parametrize(("text", "want"), [
    ("Authorization: Bearer sk-or-v1-abc123 (echoed)", "Authorization: Bearer *** (echoed)"),
    ('{"authorization": "bearer tok_123456"}', '{"authorization": "bearer ***"}'),
    ("Authorization: Basic bWU6dXJsa2V5LTEy", "Authorization: Basic ***"),
    ("GET https://me:pw@host:8/v1 failed", "GET https://***@host:8/v1 failed"),
    # left alone: nothing key-like
    ("a basic understanding; Basic understanding", "a basic understanding; Basic understanding"),
    ("bearer abc", "bearer abc"),
    ("https://host/v1 and me@example.com", "https://host/v1 and me@example.com"),
])
def test_patterns(text: str, want: str) -> None:
    assert redact(text) == want


def test_registered_values_wherever_they_appear() -> None:
    key = "key-" + secrets.token_hex(8)
    password = "p@ss/" + secrets.token_hex(4)
    header = "hdr-" + secrets.token_hex(4)
    keep_secret(key)
    keep_url_secrets(f"https://user:{password.replace('@', '%40').replace('/', '%2F')}@h/v1")
    keep_header_secrets({"X-Api-Key": header, "X-Title": "my-app-name"})
    keep_secret("short")  # too short to be worth redacting everywhere
    text = f"raw {key}; {password}; {header}; my-app-name; short"
    assert redact(text) == "raw ***; ***; ***; my-app-name; short"
    assert redact_value({"a": [key, {key: 1}], "n": 3}) == {"a": ["***", {"***": 1}], "n": 3}


def test_log_filter_redacts_messages_and_exception_text(caplog: pytest.LogCaptureFixture
                                                        ) -> None:
    key = "key-" + secrets.token_hex(8)
    keep_secret(key)
    logger = logging.getLogger("draftgen.test_redact")
    caplog.handler.addFilter(RedactingFilter())
    try:
        logger.warning("server said %s", f"Bearer {key}")
        try:
            raise RuntimeError(f"echo {key}")
        except RuntimeError:
            logger.exception("failed")
    finally:
        caplog.handler.removeFilter(caplog.handler.filters[-1])
    assert key not in caplog.text
    assert "server said Bearer ***" in caplog.text
    assert "failed: RuntimeError: echo ***" in caplog.text
