"""The command line as the docs write it: the options README.md and docs/zero-code.md give
`bsmon run` are the parser's, and every option the README's table names exists."""

from __future__ import annotations

import re

from bsmon.tui.cli import parser as cli

from ..helpers import ROOT

OPTION = re.compile(r"--[a-z][a-z-]*")
GLOBAL = {"--readonly", "--dir", "--interval"}  # rows of their own in the README's table


def own_options(command: str) -> set[str]:
    """The options of ``bsmon command`` other than --help and the global ones."""
    sub = cli._subcommand_parser(cli.build_parser(), command)
    assert sub is not None, command
    options = {o for action in sub._actions for o in action.option_strings}
    return {o for o in options if o.startswith("--")} - GLOBAL - {"--help"}


def readme_rows() -> dict[str, str]:
    """The README's command table: subcommand -> the usage written in its first cell."""
    rows = {}
    for line in (ROOT / "README.md").read_text("utf-8").splitlines():
        if match := re.match(r"\| `bsmon (\w+)([^`]*)` \|", line):
            rows[match.group(1)] = match.group(2)
    return rows


def test_the_readme_and_zero_code_give_bsmon_run_every_option_it_has():
    wanted = own_options("run")
    assert set(OPTION.findall(readme_rows()["run"])) == wanted
    zero_code = (ROOT / "docs" / "zero-code.md").read_text("utf-8")
    (usage,) = [line for line in zero_code.splitlines() if line.startswith("bsmon run [")]
    assert set(OPTION.findall(usage)) == wanted
    for option in wanted:  # and each has its line below the usage
        assert f"- `{option}" in zero_code, option


def test_every_option_in_the_readme_table_is_one_the_command_has():
    rows = readme_rows()
    assert {"list", "probe", "demo", "run", "export", "replay", "records"} <= set(rows)
    for command, usage in rows.items():
        assert set(OPTION.findall(usage)) <= own_options(command), command
