"""The machine every bench prints beside its figures (bench/host.py)."""

from __future__ import annotations

import os
import platform

import archspec.cpu

from chatmem.bench import host as host_module
from chatmem.bench.host import brand, machine


def test_the_brand_is_the_kernels_model_name(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9R14 96-Core Processor\n")
    assert brand(info) == "AMD EPYC 9R14 96-Core Processor"
    info.write_text("processor\t: 0\nmodel name\t: \n")
    assert brand(info) is None
    assert brand(tmp_path / "missing") is None


def test_the_machine_names_the_cpu_as_the_start_up_check_reads_it_and_the_cores(monkeypatch):
    monkeypatch.setattr(host_module.cgroups, "cpu_limit", lambda: None)
    host = archspec.cpu.host()
    shown = machine()
    assert f"{host.name} ({platform.machine()}" in shown and shown.endswith(f" · {os.cpu_count()} cores")
    assert (", AVX-512)" in shown) == ("avx512f" in host.features)


def test_a_container_with_fewer_cpus_than_cores_shows_its_quota(monkeypatch):
    monkeypatch.setattr(host_module.cgroups, "cpu_limit", lambda: 0.5)
    assert machine().endswith(f" · {os.cpu_count()} cores, a CPU quota of 0.5")
    monkeypatch.setattr(host_module.cgroups, "cpu_limit", lambda: float(os.cpu_count() or 1))
    assert machine().endswith(f" · {os.cpu_count()} cores")
