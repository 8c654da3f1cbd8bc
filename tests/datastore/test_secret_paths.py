"""Credentials are never indexed (rest_lsp/datastore/ignore.py): folders of secrets and files named like keys, at
any depth, whatever an ignore file or setting says; code whose name merely mentions a key is indexed."""

from __future__ import annotations

import pytest

from rest_lsp.datastore import Datastore, WorkspaceIndex
from rest_lsp.datastore.ignore import IgnoreRules

SECRETS = [
    ".ssh/id_ed25519", ".ssh/config", "home/.ssh/known_hosts", ".gnupg/pubring.kbx", ".aws/credentials",
    ".azure/accessTokens.json", ".kube/config", ".docker/config.json", ".password-store/mail.gpg",
    ".config/gcloud/application_default_credentials.json", ".config/gh/hosts.yml",
    "deploy/id_rsa", "keys/id_rsa.pub", "certs/server.pem", "certs/server.key", "certs/SERVER.KEY", "store.p12",
    "store.pfx", ".env", "app/.env.production", "prod.env", ".envrc", ".netrc", ".pgpass", ".git-credentials",
    "credentials.json", "infra/terraform.tfstate",
]
CODE = ["src/key_utils.py", "docs/ssh.md", "environment.py", "keys.py", "src/pem_reader.py", "config/settings.py",
        "ssh/client.py", "env/setup.py", "README.md"]


@pytest.mark.parametrize("rel", SECRETS)
def test_a_credential_is_never_indexed(tmp_path, rel):
    assert IgnoreRules(tmp_path).ignored(rel, False)


@pytest.mark.parametrize("rel", [".ssh", "a/.gnupg", ".aws", ".config/gcloud", ".password-store"])
def test_a_folder_of_credentials_is_not_entered(tmp_path, rel):
    assert IgnoreRules(tmp_path).ignored(rel, True)


@pytest.mark.parametrize("rel", CODE)
def test_code_whose_name_mentions_a_key_is_indexed(tmp_path, rel):
    assert not IgnoreRules(tmp_path).ignored(rel, False)


def test_no_ignore_file_or_setting_brings_a_credential_back(tmp_path):
    (tmp_path / ".gitignore").write_text("!.env\n!.ssh/\n!*.pem\n")
    rules = IgnoreRules(tmp_path, extra=["!.env", "!id_rsa"])
    assert all(rules.ignored(rel, False) for rel in (".env", ".ssh/id_rsa", "id_rsa", "server.pem"))


def test_indexing_a_home_folder_leaves_its_keys_out(tmp_path):
    """The reproduction's case: a workspace whose root is a home folder."""
    files = {".ssh/id_ed25519": "-----BEGIN OPENSSH PRIVATE KEY-----\n", ".aws/credentials": "[default]\n",
             "project/.env": "DB_PASSWORD=hunter2\n", "project/certs/tls.key": "-----BEGIN PRIVATE KEY-----\n",
             "project/main.py": "def main():\n    pass\n"}
    for rel, text in files.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    ds = Datastore(background_merges=False)
    index = WorkspaceIndex(tmp_path, ds, lambda texts: [list(t.encode()) for t in texts], "bytes", persist=False)
    index.build()
    assert set(ds.doc_ids()) == {str(tmp_path.resolve() / "project" / "main.py")}
    ds.close()
