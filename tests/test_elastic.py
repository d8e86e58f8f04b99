"""ddlcourse.elastic: checkpoints that resume exactly, and a rank killed under torchrun that the job survives."""
import os

import pytest
import torch

from ddlcourse import elastic
from ddlcourse.cluster import find_processes
from ddlcourse.selfcheck import run_checker
from ddlcourse.exercises.solutions import fault_tolerance as ex

from helpers import run_ranks


def test_resume_step_takes_the_latest_complete_checkpoint():
    assert elastic.resume_step([]) == 0
    assert elastic.resume_step(["log.jsonl", "killed-once"]) == 0
    assert elastic.resume_step(["step_9.pt", "step_10.pt", "step_000020.pt.tmp"]) == 10
    assert elastic.resume_step(["/a/b/step_000040.pt", "step_000030.pt"]) == 40


def test_save_is_atomic_and_load_restores_model_and_optimizer(tmp_path):
    model = elastic.make_model(hidden=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    x, y = elastic.batch(0, 16)
    torch.nn.functional.cross_entropy(model(x), y).backward()
    opt.step()
    elastic.save_checkpoint(tmp_path, 5, model, opt)
    assert sorted(os.listdir(tmp_path)) == ["step_000005.pt"]           # no .tmp left
    m2 = elastic.make_model(hidden=8, seed=3)
    o2 = torch.optim.SGD(m2.parameters(), lr=0.1, momentum=0.9)
    assert elastic.load_latest(tmp_path, m2, o2, device="cpu") == 5
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), m2.parameters()))
    assert torch.equal(opt.state_dict()["state"][0]["momentum_buffer"], o2.state_dict()["state"][0]["momentum_buffer"])
    assert elastic.load_latest(tmp_path / "none", m2, o2, device="cpu") == 0


def test_a_write_cut_short_leaves_the_last_checkpoint_and_a_bad_file_is_named(tmp_path, monkeypatch):
    """elastic writes and reads through the course's one checkpoint write and read (training.checkpoint)."""
    from ddlcourse import training
    model = elastic.make_model(hidden=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    elastic.save_checkpoint(tmp_path, 4, model, opt)
    real = torch.save

    def crash(obj, f):                       # the process dies halfway through the write
        with open(f, "wb") as out:
            out.write(b"half a checkpoint")
        raise KeyboardInterrupt

    monkeypatch.setattr(torch, "save", crash)
    with pytest.raises(KeyboardInterrupt):
        elastic.save_checkpoint(tmp_path, 8, model, opt)
    monkeypatch.setattr(torch, "save", real)
    assert sorted(os.listdir(tmp_path)) == ["step_000004.pt", "step_000008.pt.tmp"]
    assert elastic.load_latest(tmp_path, model, opt, device="cpu") == 4          # the .tmp is not a checkpoint
    (tmp_path / "step_000004.pt").write_bytes(b"garbage")
    with pytest.raises(training.CheckpointError, match="step_000004.pt is unreadable: not a readable checkpoint"):
        elastic.load_latest(tmp_path, model, opt, device="cpu")
    elastic.save_checkpoint(tmp_path, 12, elastic.make_model(hidden=16), opt)   # another model's weights
    with pytest.raises(training.CheckpointError, match="step_000012.pt is unreadable: it does not fit this model"):
        elastic.load_latest(tmp_path, model, opt, device="cpu")


def test_summarize_finds_the_resume_and_the_repeats():
    log = [{"attempt": 0, "resumed_from": 0, "time": 0}] + \
          [{"attempt": 0, "step": s, "loss": 1.0 / s, "time": s} for s in range(1, 10)] + \
          [{"attempt": 1, "resumed_from": 8, "time": 20}] + \
          [{"attempt": 1, "step": s, "loss": 1.0 / s, "time": 20 + s} for s in range(9, 13)]
    s = elastic.summarize(log, every=4, kill_at=9)
    assert s["resumes_at_saved_step"] and s["lost_steps"] == 1 and s["repeats_agree"]
    assert s["repeated_steps"] == [9] and s["restart_seconds"] == 20
    log[-4]["loss"] = 0.5                                      # a resume that is not exact
    assert not elastic.summarize(log, every=4, kill_at=9)["repeats_agree"]


def test_require_resumed_explains_a_run_that_did_not_finish():
    log = [{"attempt": 0, "resumed_from": 0, "time": 0}] + \
          [{"attempt": 0, "step": s, "loss": 1.0 / s, "time": s} for s in range(1, 10)]
    with pytest.raises(RuntimeError, match="did not restart and finish: 1 attempt.*last step 9 of 12"):
        elastic.require_resumed(elastic.summarize(log, every=4, kill_at=9), 12, output="torchrun said no")
    log += [{"attempt": 1, "resumed_from": 8, "time": 20}] + \
           [{"attempt": 1, "step": s, "loss": 1.0 / s, "time": 20 + s} for s in range(9, 13)]
    assert elastic.require_resumed(elastic.summarize(log, every=4, kill_at=9), 12)["lost_steps"] == 1


def test_generation_store_gives_each_restart_a_clean_namespace(monkeypatch):
    import datetime
    import torch.distributed as tdist
    server = tdist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)   # the agent's store
    for k, v in dict(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(server.port), RANK="1", WORLD_SIZE="2",
                     TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_RESTART_COUNT="0").items():
        monkeypatch.setenv(k, v)
    timeout = datetime.timedelta(seconds=10)
    old, rank, world = elastic.generation_store(timeout)
    assert (rank, world) == (1, 2)
    old.set("rank_0", "address of a process that is gone")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    new, _, _ = elastic.generation_store(timeout)
    assert old.check(["rank_0"]) and not new.check(["rank_0"])       # the restart does not see stale keys
    assert server.check(["ddlcourse/generation_0/rank_0"])


def test_train_loop_refuses_bad_sizes():
    assert "REFUSED global_batch 63" in run_ranks(2, "elastic_bad_sizes").stdout


def test_a_killed_rank_restarts_and_resumes_from_the_checkpoint(tmp_path):
    res = elastic.run_torchrun(tmp_path, nproc=2, steps=12, every=4, kill_at=9, timeout=420)
    assert res["returncode"] == 0, res["output"]
    assert (tmp_path / elastic.KILLED_MARKER).exists()                 # the rank really was killed
    s = elastic.summarize(res["log"], every=4, kill_at=9)
    assert s["attempts"] >= 2 and s["resumes_at_saved_step"], s
    assert s["lost_steps"] <= 4 and s["last_step"] == 12
    assert s["repeated_steps"] and s["repeats_agree"]                  # step 9 ran twice, with the same loss
    assert not [p for p in find_processes(names=("ddlcourse.elastic", "torch.distributed.run"))
                if str(tmp_path) in p[1]]


# --------------------------------------------------------------------------- the coding exercise
def test_resume_checker_accepts_the_reference():
    assert run_checker("resume_step", elastic.resume_step).ok


@pytest.mark.parametrize("wrong, hint", [
    (ex._sorted_as_text, "as numbers"),
    (ex._counts_tmp, ".tmp"),
    (ex._first_not_latest, "latest"),
    (ex._none_when_empty, "start from step 0"),
])
def test_resume_checker_names_the_mistake(wrong, hint):
    v = run_checker("resume_step", wrong)
    assert not v.ok and hint in v.message, v.message


def test_torchrun_starts_at_most_one_worker_per_gpu_of_this_node(monkeypatch, capsys):
    """Notebook 25 runs torchrun on the notebook's node only: 8 ranks asked for on a 4-GPU node start 4 workers."""
    import torch

    from ddlcourse import elastic
    assert elastic.workers_here(8) == 8 or torch.cuda.is_available()        # CPU: as many as asked
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    assert elastic.workers_here(8) == 4 and "4 GPU(s) on this node: starting 4" in capsys.readouterr().out
    assert elastic.workers_here(2) == 2
    with pytest.raises(ValueError, match="at least 1"):
        elastic.workers_here(0)


def test_every_rank_resumes_from_the_step_rank_0_chose(tmp_path):
    """On an NFS home a node may see a listing of the checkpoint folder cached for 30-60 s: rank 1 here is shown
    the folder without its newest checkpoint, and still resumes where rank 0 does, with rank 0's state."""
    import json
    out = json.loads(run_ranks(2, "elastic_resume_older_listing", tmp_path).stdout.strip().splitlines()[-1])
    assert out["own"] == [8, 4], out                       # rank 1's own listing really is older
    assert out["loaded"] == [8, 8] and out["same_state"] == [True, True], out
    assert out["resumed"] == [8, 8], out                   # and train_loop's next attempt resumes there too
