"""Runs last (file order): after every build of the session, the server's log must not contain
an upload URL's signature or any API key, though both crossed the wire many times."""

import re

from e2b import Template


def test_no_signature_or_api_key_in_any_log_line(strata, team, context_dir):
    _, opts = team
    # An upload of its own, so the check has something to look at even when run alone.
    tpl = Template(file_context_path=str(context_dir)).from_image("busybox").copy("notes", "/notes")
    Template.build(tpl, "log-hygiene", **opts)
    text = (strata.data_dir / "strata.log").read_text(errors="replace")
    assert "/upload/" in text, "upload requests are logged (by path)"
    assert not re.search(r"[?&]sig=", text), "an upload URL signature was logged"
    assert strata.issued_keys
    for key in strata.issued_keys:
        assert key[4:] not in text, "an API key was logged"
