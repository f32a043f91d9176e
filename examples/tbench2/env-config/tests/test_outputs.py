# The same checks as test.sh, for `--verifier pytest`.
import os
from pathlib import Path

CONF = Path("/app/deploy.conf")


def test_verifier_env_present():
    assert os.environ.get("EXPECTED_RELEASE")
    assert os.environ.get("EXPECTED_PORT")


def test_content():
    expected = "release={}\nport={}\nenvironment={}".format(
        os.environ["EXPECTED_RELEASE"], os.environ["EXPECTED_PORT"],
        os.environ["DEPLOY_ENV"])
    assert CONF.read_text().rstrip("\n") == expected


def test_symlink():
    link = Path("/app/current.conf")
    assert link.is_symlink()
    assert link.resolve() == CONF
