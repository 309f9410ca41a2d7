"""On resume, the versions a comparison's runs were made with against the running ones.

A run continued under another torch, torchvision, normkit, normkit-lab or plugin release (or another
commit of normkit-lab's source checkout) no longer repeats bit-identically: a plugin release may
change a norm's noise or its compiled path, and the saved runs would then be compared with runs of
other code. So a resume under changed versions is refused, unless asked for (`--allow-version-change`,
`allow_version_change=True`); then the running environment is recorded in environment.json under
`resumes`, the original keys kept as they were, and the next resume compares with it.

Not compared: numpy (normkit seeds only its legacy generator, whose stream numpy keeps fixed),
scipy and matplotlib (analysis and figures, recomputed from the rows), normkit-cli (a front end),
and the working directory's commit (a `--command` program's files are hashed instead).
A results directory older than these records keeps resuming, with one warning that the versions
could not be checked.
"""

from __future__ import annotations

import time
from typing import Any

from normkit.plugins import IN_PROCESS_DISTRIBUTION
from normkit_lab.errors import ConfigError

ALLOW_FLAG = "--allow-version-change"
RESUMES_KEY = "resumes"
COMPARED = ("torch", "torchvision", "normkit", "normkit-lab")
SOURCE = "normkit-lab source"  # how a changed commit of normkit-lab's checkout is named


class UncheckedVersions(UserWarning):
    """A resumed results directory does not record the versions its runs were made with."""


def reference(saved: dict[str, Any]) -> dict[str, Any]:
    """The environment the latest runs were made with: the last recorded resume's, else the original."""
    resumes = saved.get(RESUMES_KEY)
    if isinstance(resumes, list) and resumes and isinstance(resumes[-1], dict):
        env = resumes[-1].get("environment")
        if isinstance(env, dict):
            return env
    return saved


def _plugin_versions(env: dict[str, Any]) -> dict[str, Any] | None:
    """Installed plugin distribution -> version (None when `env` does not list plugins)."""
    plugins = env.get("plugins")
    if not isinstance(plugins, list):
        return None
    return {p["distribution"]: p.get("version") for p in plugins
            if isinstance(p, dict) and isinstance(p.get("distribution"), str)
            and p["distribution"] != IN_PROCESS_DISTRIBUTION}


def _source(env: dict[str, Any]) -> Any:
    commits = env.get("git_commit")
    return commits.get("normkit_lab_source") if isinstance(commits, dict) else None


def _compiler(value: Any) -> str:
    return "none (kernels run on torch ops)" if value is None else repr(value)


def _shown(value: Any) -> str:
    return "not installed" if value is None else str(value)


def differences(saved: dict[str, Any], now: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(what changed, e.g. "normkit-normalnorm 0.3.0 -> 0.4.0"; what `saved` does not record, so could
    not be compared). Only what both environments record is compared."""
    changed: list[str] = []
    unknown: list[str] = []
    versions, running = saved.get("versions"), now.get("versions") or {}
    if isinstance(versions, dict):
        changed += [f"{dist} {_shown(versions[dist])} -> {_shown(running.get(dist))}" for dist in COMPARED
                    if dist in versions and versions[dist] != running.get(dist)]
        # every version is recorded (None when not installed): a compared one missing was deleted, and
        # deleting it must not turn its check off
        changed += [f"{dist} (not recorded) -> {_shown(running[dist])}" for dist in COMPARED
                    if dist not in versions and dist in running]
    else:
        unknown.append("versions")
    plugins, running_plugins = _plugin_versions(saved), _plugin_versions(now) or {}
    if plugins is None:
        unknown.append("plugins")
    else:
        changed += [f"{dist} {_shown(plugins.get(dist))} -> {_shown(running_plugins.get(dist))}"
                    for dist in sorted(set(plugins) | set(running_plugins))
                    if dist not in COMPARED and plugins.get(dist) != running_plugins.get(dist)]
    if "c_compiler" in saved and saved["c_compiler"] != now.get("c_compiler"):  # lnn's row kernel or its fallback
        changed.append(f"C compiler {_compiler(saved['c_compiler'])} -> {_compiler(now.get('c_compiler'))}")
    source, running_source = _source(saved), _source(now)
    if source and running_source and source != running_source:
        changed.append(f"{SOURCE} {str(source)[:12]} -> {str(running_source)[:12]}")
    return changed, unknown


def check_resume(where: str, saved: dict[str, Any] | None, now: dict[str, Any],
                 allow_change: bool) -> tuple[dict[str, Any] | None, str | None]:
    """(environment.json to write, or None to leave it as it is; a warning line, or None) for resuming
    under `now` the results directory whose environment.json (`where`) holds `saved` (None: absent).
    A version change without `allow_change` raises one ConfigError naming every change."""
    if saved is None:
        return None, (f"{where} is missing, so resuming cannot check that the runs are made with the same "
                      f"torch, normkit and plugin versions as before")
    changed, unknown = differences(reference(saved), now)
    warning = (f"{where} does not record {' or '.join(unknown)} (an older results directory), so resuming "
               f"cannot check them against the running ones") if unknown else None
    if not changed:
        return None, warning
    if not allow_change:
        raise ConfigError(f"{where}: this comparison's runs were made with other versions "
                          f"({'; '.join(changed)}), so resumed runs would not repeat them bit-identically; "
                          f"reinstall those versions, rerun with {ALLOW_FLAG} (allow_version_change=True in "
                          f"compare_norms) to continue anyway and record the change, or start a new comparison "
                          f"with --out")
    resumes = saved.get(RESUMES_KEY)
    entry = {"resumed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "changes": changed,
             "environment": now}
    return {**saved, RESUMES_KEY: [*(resumes if isinstance(resumes, list) else []), entry]}, warning
