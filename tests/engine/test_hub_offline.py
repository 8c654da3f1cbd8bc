"""A model named by its hub id loads from the local Hugging Face cache without touching the network, also without
HF_HUB_OFFLINE: the subprocess runs under the network guard of tests/netguard, which refuses and logs every
connection off this machine and every DNS lookup."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

GUARD = Path(__file__).resolve().parents[1] / "netguard"
REVISION = "0123456789abcdef0123456789abcdef01234567"
LOAD = textwrap.dedent("""
    import sys
    from rest_lsp.engine.model import ModelLoadError, load_model, load_tokenizer

    loaded = load_model(sys.argv[1], "cpu", "float32")
    tokenizer = load_tokenizer(sys.argv[1])
    assert tokenizer.encode("def f(x):") == loaded.tokenizer.encode("def f(x):")
    try:
        load_model("tiny-org/not-downloaded", "cpu", "float32")
    except ModelLoadError as err:
        print(err)
    print("loaded", type(loaded.model).__name__)
""")


def hub_cache(tmp_path: Path, model_folder: Path) -> Path:
    """A hub cache folder holding `model_folder` as tiny-org/tiny-random at REVISION, as a download leaves it."""
    repo = tmp_path / "hf" / "hub" / "models--tiny-org--tiny-random"
    shutil.copytree(model_folder, repo / "snapshots" / REVISION)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(REVISION)
    return repo.parent


def test_a_cached_hub_model_loads_without_any_network_attempt(tiny_models, tmp_path):
    hub = hub_cache(tmp_path, tiny_models["random"])
    attempts = tmp_path / "network-attempts.log"
    env = {k: v for k, v in os.environ.items() if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    env.update(PYTHONPATH=os.pathsep.join([str(GUARD), *filter(None, [env.get("PYTHONPATH")])]),
               REST_LSP_NETGUARD_LOG=str(attempts), HF_HOME=str(tmp_path / "hf"), HF_HUB_CACHE=str(hub),
               REST_LSP_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", LOAD, "tiny-org/tiny-random"], env=env, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "loaded LlamaForCausalLM" in done.stdout
    assert not attempts.exists(), attempts.read_text()
    assert "'tiny-org/not-downloaded': it is not in the local Hugging Face cache" in done.stdout
