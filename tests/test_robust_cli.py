"""The CLI on bad input: exit code 2, one ``error:`` line, no traceback (unless --debug).

Every case runs ``python -c "from batchsim.app.cli import main; main()" ...`` in a
subprocess, as a user's shell would; the cases start together (a thread
pool) so the whole file costs a few interpreter start-ups, not dozens.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CMD = [sys.executable, "-c", "from batchsim.app.cli import main; main()"]
SCENARIO = "workload: {num_requests: 2, arrival: {process: poisson, rate: 5}}\n"


def write_files(d: Path) -> None:
    (d / "s.yaml").write_text(SCENARIO)
    (d / "bad.yaml").write_text("model: llama-3-8b\npolicy: [unclosed\n")
    (d / "unknown.yaml").write_text(SCENARIO + "bogus: 1\n")
    (d / "ff.yaml").write_text(SCENARIO + "fast_forward: true\n")
    model = json.loads(json.dumps({"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
                                   "num_key_value_heads": 64, "intermediate_size": 14336, "vocab_size": 128256,
                                   "max_position_embeddings": 8192}))
    (d / "m").mkdir()
    (d / "m" / "config.json").write_text(json.dumps(model))
    (d / "model.yaml").write_text(SCENARIO + f"model: {d / 'm'}\n")
    (d / "t.csv").write_text("arrival,prompt_tokens,output_tokens\n0,10,5\n0.5,-3,5\n")
    (d / "trace.yaml").write_text("workload: {trace: {format: csv, path: t.csv}}\n")
    (d / "afile").write_text("")
    (d / "dup.yaml").write_text(SCENARIO + "replicas: 1\nreplicas: 2\n")
    (d / "adir").mkdir()
    (d / "trdir.yaml").write_text("workload: {trace: {format: csv, path: adir}}\n")
    (d / "notaplan.py").write_text(
        "from batchsim.policies import PolicyConfig\n\n"
        "class NotAPlan:\n"
        "    name = 'not_a_plan'\n"
        "    Config = PolicyConfig\n\n"
        "    def __init__(self, config=None):\n"
        "        self.config = config or PolicyConfig(name=self.name)\n\n"
        "    def schedule(self, view):\n"
        "        return None\n")


# (id, arguments, the exact stderr). {d} is the case folder (also the working directory).
CASES = [
    ("missing-file", ["run", "nope.yaml"], "error: no such scenario file: nope.yaml"),
    ("markup-in-path", ["run", "[/b].yaml"], "error: no such scenario file: [/b].yaml"),
    ("bad-yaml", ["run", "bad.yaml"], "error: bad.yaml:3: not valid YAML: expected ',' or ']', but got '<stream end>'"),
    ("unknown-field", ["run", "unknown.yaml"],
     "error: unknown.yaml: bogus: unknown field; expected one of disaggregation, dtype, engine, engine_preset, engine_preset_values, hardware, horizon_s, kv_cache_dtype, "
     "max_queue_len, measure, model, name, overheads, policy, policy_knobs, replicas, router, seed, slo, "
     "tensor_parallel_size, workload (got 1)"),
    ("removed-field", ["run", "ff.yaml"],
     "error: ff.yaml: fast_forward: this field was removed (the Python engine runs step by step; "
     "engine: auto picks the compiled core, the fast one); delete it"),
    ("non-finite", ["run", "s.yaml", "--set", "workload.arrival.rate=.inf"],
     "error: s.yaml: workload.arrival.rate: Input should be a finite number (got inf)"),
    ("bad-set", ["run", "s.yaml", "--set", "replicas"], "error: --set: expected dotted.key=value, got 'replicas'"),
    ("policy-knob", ["run", "s.yaml", "--set", "policy.max_num_seqs=0"],
     "error: s.yaml: policy.max_num_seqs: got 0; expected greater than or equal to 1"),
    ("model-config", ["run", "model.yaml"],
     "error: {d}/m/config.json: num_attention_heads (32) must be a multiple of num_key_value_heads (64)"),
    ("trace-line", ["run", "trace.yaml"],
     "error: {d}/t.csv, line 3, column 'prompt_tokens': negative value '-3'; expected a whole number of tokens >= 0"),
    ("too-many-requests", ["run", "s.yaml", "--set", "workload.duration_s=1e9", "--set", "workload.num_requests=null"],
     "error: s.yaml: workload.duration_s: about 5e+09 requests arrive within duration_s; expected at most "
     "100000000 (shorten duration_s, lower the rate or set num_requests)"),
    ("out-is-a-file", ["run", "s.yaml", "--out", "afile"],
     "error: --out: afile is a file; expected a folder for the records"),
    ("unknown-option", ["run", "s.yaml", "--bogus"],
     "error: No such option: --bogus (Possible options: --out) (see 'batchsim run --help')"),
    ("option-bound", ["cost", "llama-3-8b", "h100-sxm", "--decode", "1000000000000"],
     "error: Invalid value for '--decode': Input should be less than or equal to 1000000 (see 'batchsim cost --help')"),
    ("duplicate-key", ["run", "dup.yaml"],
     "error: dup.yaml:3: not valid YAML: duplicate key 'replicas' (first at line 2); expected each key once"),
    ("bool-count", ["run", "s.yaml", "--set", "workload.num_requests=true"],
     "error: s.yaml: workload.num_requests: Input should be an integer, not a boolean (got True)"),
    ("bool-knob", ["run", "s.yaml", "--set", "policy.max_num_seqs=true"],
     "error: s.yaml: policy.max_num_seqs: got True; expected an integer, not a boolean"),
    ("max-model-len", ["run", "s.yaml", "--set", "policy.max_model_len=100000"],
     "error: s.yaml: policy.max_model_len: got 100000, above llama-3-8b's context length (max_position_embeddings "
     "8192); expected at most 8192"),
    ("block-size", ["run", "s.yaml", "--set", "policy.block_size=7"],
     "error: s.yaml: policy.block_size: got 7; expected one of vLLM's block sizes 1, 8, 16, 32, 64, 128, 256"),
    ("cost-does-not-fit", ["cost", "llama-3.1-405b", "h100-sxm", "--decode", "1", "--context", "10"],
     "error: llama-3.1-405b (bf16) does not fit on h100-sxm at tp=1: 0.9 x 80 GiB = 72.0 GiB per GPU, but weights "
     "take 756.0 GiB, runtime reserve 1.0 GiB and activations 3.3 GiB, leaving -688.3 GiB for the KV cache; raise "
     "--tp or use a smaller dtype"),
    ("scenario-folder", ["run", "adir"], "error: adir: is a folder; expected a scenario YAML file"),
    ("baseline-folder", ["regress", "s.yaml", "--baseline", "adir"],
     "error: --baseline adir: is a folder; expected a baseline JSON file"),
    ("trace-folder", ["run", "trdir.yaml"], "error: adir: is a folder (resolved to {d}/adir); expected a trace file"),
    ("profile-folder", ["run", "s.yaml", "--set", "hardware=adir"],
     "error: adir: is a folder (resolved to {d}/adir); expected a hardware profile YAML file"),
    ("scenario-tp", ["run", "s.yaml", "--set", "tensor_parallel_size=3"],
     "error: s.yaml: tensor_parallel_size: num_attention_heads (32) is not divisible by tensor_parallel_size=3 for "
     "llama-3-8b"),
    ("option-tp", ["cost", "llama-3-8b", "h100-sxm", "--tp", "3", "--prefill", "8"],
     "error: --tp 3 for llama-3-8b: num_attention_heads (32) is not divisible by tp=3"),
    ("plugin-not-a-plan", ["run", "s.yaml", "--set", "policy.name=notaplan:NotAPlan"],
     "error: s.yaml: policy: 'notaplan:NotAPlan' broke the engine contract: schedule() returned NoneType; "
     "expected a batchsim.sim.types.BatchPlan"),
]
OTHER = [("version", ["--version"]), ("debug", ["--debug", "run", "nope.yaml"])]


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    """Run every case at once; {id: (returncode, stdout, stderr, folder)}."""

    def one(case):
        cid, args = case[:2]
        d = tmp_path_factory.mktemp(cid)
        write_files(d)
        r = subprocess.run(CMD + args, capture_output=True, text=True, cwd=d, timeout=120)
        return cid, (r.returncode, r.stdout, r.stderr, d)

    with ThreadPoolExecutor(max_workers=4) as pool:
        return dict(pool.map(one, CASES + OTHER))


@pytest.mark.parametrize("cid, args, expected", CASES, ids=[c[0] for c in CASES])
def test_bad_input_exits_2_with_one_exact_error_line_and_no_traceback(outcomes, cid, args, expected):
    rc, out, err, d = outcomes[cid]
    assert "Traceback" not in err and "Traceback" not in out
    assert rc == 2, err
    assert err.strip() == expected.format(d=d)


def test_debug_shows_the_traceback(outcomes):
    rc, out, err, _ = outcomes["debug"]
    assert rc == 1 and "Traceback" in err and "InputError: no such scenario file: nope.yaml" in err


def test_version(outcomes):
    rc, out, err, _ = outcomes["version"]
    assert rc == 0 and out.startswith("batchsim ") and not err


def test_ctrl_c_exits_130_and_says_finished_results_are_kept(tmp_path):
    (tmp_path / "big.yaml").write_text("workload: {num_requests: 3000000, arrival: {process: poisson, rate: 1000}}\n")
    p = subprocess.Popen(CMD + ["run", "big.yaml", "--out", "o"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, cwd=tmp_path,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    time.sleep(4)  # imported and simulating
    p.send_signal(signal.SIGINT)
    out, err = p.communicate(timeout=60)
    assert p.returncode == 130, err
    assert err.strip() == "interrupted; finished results already written are kept"
    assert not (tmp_path / "o").exists()  # nothing half-written
