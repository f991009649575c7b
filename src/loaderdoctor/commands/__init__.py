"""The subcommands of the command line, one module each: every module has NAME, SCHEMA (its --json schema, or
None), prepare_parser(subparsers) and run(args, out, err) -> exit status."""

from __future__ import annotations

from loaderdoctor.commands import check, history, plan, report, run, scale, scenarios, tune

COMMANDS = {module.NAME: module for module in (check, tune, scale, run, plan, history, report, scenarios)}
