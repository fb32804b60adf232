"""Team isolation of template names through the unmodified E2B Python SDK (issue 9, item 1).

Team `T-corp`'s template `x` and team `T`'s name `corp-x` once shared one name-claim stream
(`templatename-{team}-{name}`): `T` saw `T-corp`'s template as its own `corp-x`, could not
register that name, and could remove `T-corp`'s tags.
"""

import uuid

import pytest
from e2b import Template


def test_names_of_teams_with_dashes_stay_apart(strata):
    base = f"t{uuid.uuid4().hex[:10]}"
    acme = {"api_key": strata.key(base), "api_url": strata.url}
    acme_corp = {"api_key": strata.key(f"{base}-corp"), "api_url": strata.url}

    built = Template.build(Template().from_image("busybox").run_cmd("true"), "x", **acme_corp)
    assert Template.exists("x", **acme_corp)
    assert not Template.exists("corp-x", **acme), "another team's template is not visible"

    # The name is free in this team: no squatting, and no 400 that would reveal it elsewhere.
    mine = Template.build_in_background(Template().from_image("busybox"), "corp-x", **acme)
    assert mine.template_id != built.template_id
    assert Template.exists("corp-x", **acme)

    # Removing tags through the name reaches only this team's template, which has no such tag.
    with pytest.raises(Exception):
        Template.remove_tags("corp-x", "default", **acme)
    tags = [t.tag for t in Template.get_tags(built.template_id, **acme_corp)]
    assert "default" in tags, tags
