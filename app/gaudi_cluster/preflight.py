"""`gaudi-cluster doctor`: survey every node in parallel and print the findings as a table and JSON."""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import TextIO

from gaudi_cluster import doctor
from gaudi_cluster.config import ClusterConfig
from gaudi_cluster.roles import env_for, program_from_args, requested_slots, survey_nodes


def run_doctor(
    config: ClusterConfig, environ: Mapping[str, str], out: TextIO, json_only: bool = False
) -> int:
    program = program_from_args([], sys.executable, config.accelerator)
    survey = survey_nodes(config, program, environ)
    master_report = survey.reports.get(survey.master_addr, {})
    accelerator = (
        config.accelerator if config.accelerator != "auto" else master_report.get("accelerator", "cpu")
    )
    env_file = env_for(config, accelerator, master_report, environ, survey.socket_ifname)
    findings = doctor.check_nodes(
        survey.reports,
        survey.unreachable,
        requested_slots(config, survey),
        survey.socket_ifname,
        env_file.as_dict(),
        survey.paths,
    )
    if not json_only:
        out.write(doctor.render_table(findings) + "\n\n")
    out.write(doctor.render_json(findings) + "\n")
    problems = doctor.blocking(findings)
    if problems:
        first = problems[0]
        print(
            f"gaudi-cluster: doctor: {len(problems)} blocking problem(s); first: {first.host} {first.check}: "
            f"{first.detail}; fix: {first.fix}",
            file=sys.stderr,
        )
        return 3
    return 0
