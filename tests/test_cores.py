"""The thread team: sized from the affinity mask, the cgroup quota and --threads, and resized while other processes
use this process's CPUs (specdec/kernels/cores.py). Everything here is counted, not timed: the cgroup folders are
written under tmp_path, and the clock, /proc/stat's busy time and the process's CPU time are fed in."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from specdec.errors import SpecdecError
from specdec.kernels import cores
from specdec.kernels.cores import Budget, Sharing, cgroup_quota, cpu_list, read_cpu_busy


def test_cpu_list_writes_ranges_as_taskset_does():
    assert cpu_list([0, 1]) == "0-1" and cpu_list([3]) == "3" and cpu_list([0, 2, 3, 4, 7, 9, 10]) == "0,2-4,7,9-10"


def cgroup_v2(tmp_path, inner: str | None, outer: str | None):
    (tmp_path / "proc").write_text("0::/outer/inner\n")
    for folder, value in ((tmp_path / "fs/outer", outer), (tmp_path / "fs/outer/inner", inner)):
        folder.mkdir(parents=True, exist_ok=True)
        if value is not None:
            (folder / "cpu.max").write_text(value + "\n")
    return tmp_path / "proc", tmp_path / "fs"


def test_v2_quota_is_the_smallest_along_the_path(tmp_path):
    assert cgroup_quota(*cgroup_v2(tmp_path, "150000 100000", "max 100000")) == 1.5
    assert cgroup_quota(*cgroup_v2(tmp_path, "max 100000", "50000 100000")) == 0.5
    assert cgroup_quota(*cgroup_v2(tmp_path, "max 100000", "max 100000")) is None


def test_v1_quota_and_a_container_whose_cgroup_is_mounted_as_the_root(tmp_path):
    (tmp_path / "proc").write_text("4:memory:/x\n3:cpu,cpuacct:/docker/abc\n")
    cpu = tmp_path / "fs/cpu,cpuacct"  # the container sees its own cgroup at the root, not /docker/abc
    cpu.mkdir(parents=True)
    (cpu / "cpu.cfs_quota_us").write_text("200000\n")
    (cpu / "cpu.cfs_period_us").write_text("100000\n")
    assert cgroup_quota(tmp_path / "proc", tmp_path / "fs") == 2.0
    (cpu / "cpu.cfs_quota_us").write_text("-1\n")
    assert cgroup_quota(tmp_path / "proc", tmp_path / "fs") is None


def test_no_cgroup_files_means_no_quota(tmp_path):
    assert cgroup_quota(tmp_path / "missing", tmp_path) is None
    (tmp_path / "proc").write_text("0::/\n")
    assert cgroup_quota(tmp_path / "proc", tmp_path) is None


def test_budget_takes_whole_cpus_of_the_mask_and_quota_and_says_so():
    assert Budget((0, 1), None).threads == 2
    assert Budget((0, 1), 1.0).threads == 1
    assert Budget((0, 1), 1.5).threads == 1  # a second thread would wait at barriers through throttled periods
    assert Budget((0, 1, 2, 3), 2.0).threads == 2
    assert Budget((0, 1), 0.3).threads == 1
    assert Budget((0,), None, requested=4).threads == 4
    assert Budget((0, 1), 2.0).describe().startswith("threads: 2 (affinity 0-1, quota 2.0 CPUs)")
    assert "set by --threads" in Budget((0, 1), None, 1).describe()


@pytest.mark.parametrize("bad", ["0", "-2", "two", "1.5"])
def test_bad_thread_counts_are_one_clear_error(bad, monkeypatch):
    with pytest.raises(SpecdecError, match="positive whole number"):
        Budget.read(bad)
    monkeypatch.setenv(cores.ENV, bad)
    with pytest.raises(SpecdecError, match=cores.ENV):
        Budget.read()


def test_env_and_flag(monkeypatch):
    monkeypatch.setenv(cores.ENV, "1")
    assert Budget.read().requested == 1 and Budget.read("auto").requested is None and Budget.read(3).requested == 3
    monkeypatch.setenv(cores.ENV, "auto")
    assert Budget.read().requested is None


def test_proc_stat_busy_time_counts_only_the_allowed_cpus(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text("cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 10 1 5 100 7 2 3 4 0 0\ncpu1 20 0 0 50 0 0 0 0 0 0\nintr 5\n")
    hz = os.sysconf("SC_CLK_TCK")
    assert read_cpu_busy((0,), stat) == pytest.approx((10 + 1 + 5 + 2 + 3 + 4) / hz)  # idle and iowait left out
    assert read_cpu_busy((0, 1), stat) == pytest.approx(45 / hz)
    assert read_cpu_busy((0,), tmp_path / "none") is None


class Machine:
    """A fake clock, /proc/stat busy time and own CPU time, and the team sizes asked for."""

    def __init__(self):
        self.t = self.busy = self.own = 0.0
        self.sizes: list[int] = []

    def run(self, seconds: float, ours: float, others: float) -> None:
        """`seconds` pass with this process using `ours` CPUs and others `others` of the allowed ones."""
        self.t += seconds
        self.own += ours * seconds
        self.busy += (ours + others) * seconds

    def sharing(self, budget: Budget) -> Sharing:
        return Sharing(budget, 0.1, self.sizes.append, lambda: self.busy, lambda: self.own, lambda: self.t)


def test_team_drops_a_thread_while_another_process_takes_a_core_and_takes_it_back_after():
    m = Machine()
    s = m.sharing(Budget((0, 1), None))
    assert s.threads == 2 and m.sizes == [2]
    m.run(0.05, 2.0, 0.0)
    assert s.before_pass() == 2  # within the interval: no look at all
    m.run(0.10, 2.0, 0.1)
    assert s.before_pass() == 2  # a client's tenth of a CPU is not worth a thread
    m.run(0.15, 1.0, 1.0)  # another server takes a core
    assert s.before_pass() == 1 and m.sizes == [2, 1] and s.others == pytest.approx(1.0)
    for _ in range(5):
        m.run(0.12, 1.0, 1.0)  # it stays: a team of one beside it, no flapping
        assert s.before_pass() == 1
    m.run(0.12, 1.0, 0.5)  # half a core taken is still too much for a second thread
    assert s.before_pass() == 1
    m.run(0.12, 1.0, 0.0)  # it left
    assert s.before_pass() == 2 and m.sizes == [2, 1, 2] and s.changes == 2


def test_a_hog_on_every_core_leaves_one_thread_and_never_none():
    m = Machine()
    s = m.sharing(Budget((0, 1, 2, 3), None))
    m.run(0.2, 2.0, 2.0)
    assert s.before_pass() == 2  # floor(4 - 2 + 0.5)
    m.run(0.2, 1.0, 3.0)
    assert s.before_pass() == 1
    m.run(0.2, 0.5, 3.5)
    assert s.before_pass() == 1
    for _ in range(3):  # it grows back one thread per look, never past the budget
        m.run(0.2, 1.0, 0.0)
        s.before_pass()
    assert s.threads == 4 and m.sizes[-3:] == [2, 3, 4]
    m.run(0.2, 4.0, 0.0)
    assert s.before_pass() == 4


def test_after_an_idle_spell_the_first_look_only_starts_a_window():
    m = Machine()
    s = m.sharing(Budget((0, 1), None))
    m.run(30.0, 0.0, 1.9)  # idle for long while others were busy: says little about the next pass
    assert s.before_pass() == 2
    m.run(0.1, 1.0, 1.0)
    assert s.before_pass() == 1


def test_a_fixed_team_never_changes_and_an_unreadable_proc_stat_changes_nothing():
    m = Machine()
    s = m.sharing(Budget((0, 1), None, requested=2))
    m.run(0.5, 1.0, 1.0)
    assert s.before_pass() == 2 and m.sizes == [2]
    blind = Sharing(Budget((0, 1), None), 0.1, m.sizes.append, lambda: None, lambda: m.own, lambda: m.t)
    m.run(0.5, 1.0, 1.0)
    assert blind.before_pass() == 2


def test_the_team_is_torchs_thread_count_on_the_passing_thread():
    before = torch.get_num_threads()
    try:
        s = Sharing(Budget((0,), None, requested=1), 0.1)
        assert s.threads == 1 and torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_every_command_takes_threads_and_a_run_shows_its_team_once_it_starts(tmp_path):
    env = {**os.environ, "SPECDEC_THREADS": "1"}
    gen = [sys.executable, "-m", "specdec.cli", "generate", "--drafter", "none", "--max-new-tokens", "2"]
    r = subprocess.run([*gen, "--prompt", "Hi"], capture_output=True, text=True, env=env)
    assert r.returncode == 0 and "specdec: threads: 1 (set by --threads/SPECDEC_THREADS; affinity" in r.stderr
    r = subprocess.run([*gen, "--prompt", ""], capture_output=True, text=True, env=env)  # bad input: one line
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "threads:" not in r.stderr
    r = subprocess.run([sys.executable, "-m", "specdec.cli", "plan", "--threads", "nope", "--alpha", "0.7"],
                       capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().splitlines() == [
        "specdec: error: --threads takes a positive whole number of threads or 'auto', got 'nope'"]
