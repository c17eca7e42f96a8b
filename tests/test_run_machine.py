"""A finished run names the machine it was made on (done.json ``machine``): float results of the same code differ
across CPUs, so a page gathering runs from several machines must be able to say which made each."""

import json

import torch

from flowzoo.benchmark.cli import main
from flowzoo.benchmark.run.machine import cpu_model, machine_record

TOY = "benchmark/configs/toy_flow_grpo.yaml"


def test_cpu_model_reads_the_first_model_name_and_falls_back_without_one(tmp_path):
    info = tmp_path / "cpuinfo"
    info.write_text("processor\t: 0\nvendor_id\t: AuthenticAMD\nmodel name\t: AMD EPYC 9654\n\n"
                    "processor\t: 1\nmodel name\t: other\n")
    assert cpu_model(info) == "AMD EPYC 9654"
    info.write_text("processor\t: 0\n")
    assert cpu_model(info) and cpu_model(info) != "AMD EPYC 9654"  # the platform's string, never empty
    assert cpu_model(tmp_path / "missing")


def test_a_finished_runs_done_json_names_its_machine(tmp_path):
    run = tmp_path / "run"
    args = ["train", TOY, "model.args.pretrain_steps=30", "model.args.hidden=32", "train.eval_every=0",
            "train.save_samples=false", "train.prompts_per_step=2", "algorithm.group_size=4", "train.steps=2",
            f"run_dir={run}", "--quiet"]
    assert main(args) == 0
    machine = json.loads((run / "done.json").read_text())["machine"]
    assert machine == machine_record()
    assert machine["torch"] == torch.__version__ and machine["cpu"] == cpu_model()
    assert machine["accelerator"] is None or isinstance(machine["accelerator"], str)
