"""The exercise page as a learner meets it: one session in headless Chromium on the built
lite site (scripts/build_lite.py), offline, every request recorded.

1. Following a "Try it in your browser" link, the page shows at once what is loading:
   the loading view is painted before JupyterLab has started, and its status line goes
   from the editor to Python's start to ready (lite/loading.js).
2. The student id is asked in the page (no browser prompt), kept, shown on a button,
   and changed from that button: the next cell draws for the new id.
3. The notebook shows no unsaved change when it opens, nor once its kernel is ready.
4. After a reload, the check cell's result from before it is marked as old; run again,
   it is the current one (here the saved answers score more than the old result).
5. A link to another chapter's notebook opens that notebook and only it; a reload then
   restores it (the workspace still works).

And axe-core (the npm package pinned in package.json), every rule of it, finds no
critical or serious violation in the page's own parts (the loading view, the id dialog
and button), nor in the whole page once the notebook is open, nor with the file
browser's filter box open (lite/a11y.js names what JupyterLab leaves unnamed, and moves
the pressed state of the toolkit's ``jp-button`` from the outer element, where
``aria-pressed`` is not allowed, to the inner button, where it still follows the
filter toggle).
"""

from __future__ import annotations

import sys
from typing import Any

import pytest
from site_helpers import ROOT

sys.path.insert(0, str(ROOT / "lite" / "py"))
sys.path.insert(0, str(ROOT / "scripts"))

from test_lite import ASSIGNMENT, solution_answers, wrong_answers  # noqa: E402

NOTEBOOK = f"{ASSIGNMENT}/rate_limiting.ipynb"
OTHER = "01_kv_cache/kv_cache.ipynb"
STUDENT = "learner-one"
NEW_STUDENT = "learner-two"
# The note old-results.js puts first in a check result restored from the saved file.
OLD_NOTE = "Result of an earlier run, before this page was loaded"
# Every text the loading view's status line shows, in order (kept by an init script).
RECORD_STATUS = """
window.__statusLog = [];
new MutationObserver(() => {
  const now = document.getElementById('kvlib-loading-now');
  const log = window.__statusLog;
  if (now && log[log.length - 1] !== now.textContent) log.push(now.textContent);
}).observe(document, {subtree: true, childList: true, characterData: true});
"""
DIRTY = "() => window.jupyterapp.shell.currentWidget.context.model.dirty"
SAVED = "() => !window.jupyterapp.shell.currentWidget.context.model.dirty"
AXE = ROOT / "node_modules" / "axe-core" / "axe.min.js"  # npm ci (make book) installs it
# Violations axe-core finds in ``include`` (CSS selectors; None: the whole page), as
# [impact, rule id, how many elements].
AXE_RUN = """async (include) => {
  const parts = include && include.filter(selector => document.querySelector(selector));
  const found = await axe.run(parts ? {include: parts} : document, {resultTypes: ['violations']});
  return found.violations.map(v => [v.impact, v.id, v.nodes.length]);
}"""
PAGE_PARTS = ["#kvlib-loading", "#kvlib-id-dialog", "#kvlib-id-button"]
# Every violation on the page as [impact, rule id, element], and how many rules passed.
AXE_ELEMENTS = """async () => {
  const found = await axe.run(document);
  return {
    violations: found.violations.flatMap(
      v => v.nodes.map(n => [v.impact, v.id, n.html.slice(0, 80)])),
    passed: found.passes.length,
  };
}"""
FILTER_TOGGLE = "filebrowser:toggle-file-filter"
# The filter toggle's pressed state: on the outer <jp-button> (attribute) and on the
# button inside it.
FILTER_PRESSED = """() => {
  const host = document.querySelector('jp-button[data-command="filebrowser:toggle-file-filter"]');
  return [host.getAttribute('aria-pressed'),
          host.shadowRoot.querySelector('button').getAttribute('aria-pressed')];
}"""
OPEN_TABS = ("() => Array.from(window.jupyterapp.shell.widgets('main'))"
             ".filter(w => w.context).map(w => w.context.path)")


def _check_output(page: Any) -> str:
    import bench_lite

    return next(out for gid, _, out in bench_lite.cells(page) if gid == "self_check")


@pytest.mark.site
def test_a_learner_session_in_the_browser() -> None:
    import bench_lite
    import build_lite

    site = build_lite.build()
    native: list[str] = []
    with bench_lite.browser_page(site) as (page, base, recorder):
        page.on("dialog", lambda dialog: (
            native.append(dialog.type) if dialog.type != "beforeunload" else None,
            dialog.accept()))
        page.add_init_script(RECORD_STATUS)
        page.goto(f"{base}lab/index.html?path={NOTEBOOK}", wait_until="commit")
        # 1. The loading view, on screen before JupyterLab exists.
        page.locator("#kvlib-loading").wait_for(state="visible", timeout=bench_lite.WAIT_MS)
        loading_text = page.locator("#kvlib-loading").inner_text()
        # 2. The id, asked in the page once the editor is there.
        asked = bench_lite.answer_student_id(page, STUDENT)
        page.wait_for_function(bench_lite.KERNEL_IDLE, timeout=bench_lite.WAIT_MS)
        # 3. No unsaved change at open; the loading view is gone once ready.
        page.wait_for_function("() => !document.getElementById('kvlib-loading')",
                               timeout=bench_lite.WAIT_MS)
        dirty_at_open = page.evaluate(DIRTY)
        marks = bench_lite.timeline(page)
        statuses = page.evaluate("() => window.__statusLog")

        # 4. A check run on wrong answers, then right answers saved but not checked.
        bench_lite.set_sources(page, wrong_answers())
        bench_lite.save_and_run_cell(page, "self_check")
        old = bench_lite.output_of(page, "self_check", r"missed")
        bench_lite.set_sources(page, solution_answers())
        page.evaluate("window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function(SAVED, timeout=bench_lite.WAIT_MS)
        page.reload()
        page.wait_for_function(bench_lite.KERNEL_IDLE, timeout=bench_lite.WAIT_MS)
        page.wait_for_function(
            "(note) => window.jupyterapp.shell.currentWidget.content.widgets.some("
            "c => JSON.stringify(c.model.outputs?.toJSON() || []).includes(note))",
            arg=OLD_NOTE, timeout=bench_lite.WAIT_MS)
        restored = _check_output(page)
        dirty_after_reload = page.evaluate(DIRTY)
        bench_lite.save_and_run_cell(page, "self_check")
        current = bench_lite.output_of(page, "self_check", r": (\d+) / \1 points")

        # 2 again: change the id from the button; the next kvlib cell draws for it.
        page.locator("#kvlib-id-button").click()
        prefilled = page.locator("#kvlib-id-input").input_value()
        bench_lite.answer_student_id(page, NEW_STUDENT)
        drawn_for = bench_lite.execute(
            page, "import course.checks\nprint(course.checks.student_id())")

        # 5. A link to chapter 1's notebook: only it opens; a reload keeps it.
        page.goto(f"{base}lab/index.html?path={OTHER}")
        page.wait_for_function(bench_lite.KERNEL_IDLE, timeout=bench_lite.WAIT_MS)
        tabs_after_link = page.evaluate(OPEN_TABS)
        page.reload()
        page.wait_for_function(bench_lite.KERNEL_IDLE, timeout=bench_lite.WAIT_MS)
        tabs_after_reload = page.evaluate(OPEN_TABS)
        remote = recorder.remote()

    assert remote == [], f"requests left the site: {remote}"
    assert native == [], "the page used a browser dialog"
    # 1. What is loading, said from the first paint on, in the order it happens.
    assert "JupyterLab" in loading_text and "Python" in loading_text
    assert marks["painted"] < marks["editor"] < marks["kernel"], marks
    assert statuses[0].startswith("Loading the notebook editor"), statuses
    assert any(s.startswith("Starting Python") for s in statuses), statuses
    assert statuses[-1].startswith("Python is ready"), statuses
    # 2. The id: what it is for, how to change it; kept and changed.
    assert "numbers" in asked and "change it later" in asked
    assert prefilled == STUDENT
    assert drawn_for.strip() == NEW_STUDENT
    # 3. Nothing unsaved before any edit.
    assert dirty_at_open is False and dirty_after_reload is False
    # 4. The old result is marked old, then replaced by the current one.
    assert "missed" in old
    assert restored.startswith(OLD_NOTE) and "missed" in restored
    assert OLD_NOTE not in current and "missed" not in current
    # 5. The link's notebook only, and a reload restores it.
    assert tabs_after_link == [OTHER]
    assert tabs_after_reload == [OTHER]


def _serious(violations: list[list[Any]]) -> list[list[Any]]:
    return [v for v in violations if v[0] in ("critical", "serious")]


@pytest.mark.site
def test_the_page_s_own_parts_pass_axe() -> None:
    import bench_lite
    import build_lite

    assert AXE.is_file(), f"{AXE} is missing: run `make book` (npm ci installs axe-core)"
    site = build_lite.build()
    with bench_lite.browser_page(site) as (page, base, _):
        page.goto(f"{base}lab/index.html?path={NOTEBOOK}", wait_until="commit")
        page.locator("#kvlib-loading").wait_for(state="visible", timeout=bench_lite.WAIT_MS)
        page.add_script_tag(path=str(AXE))
        # The whole page as first painted: the loading view alone.
        at_first_paint = page.evaluate(AXE_RUN, None)
        page.locator("#kvlib-id-dialog[open]").wait_for(timeout=bench_lite.WAIT_MS)
        with_dialog = page.evaluate(AXE_RUN, PAGE_PARTS)
        bench_lite.answer_student_id(page, STUDENT)
        with_button = page.evaluate(AXE_RUN, PAGE_PARTS[1:])
        page.wait_for_function(bench_lite.KERNEL_IDLE, timeout=bench_lite.WAIT_MS)
        page.wait_for_function("() => !document.getElementById('kvlib-loading')",
                               timeout=bench_lite.WAIT_MS)
        whole_page = page.evaluate(AXE_ELEMENTS)
        pressed_before = page.evaluate(FILTER_PRESSED)
        page.evaluate(f"window.jupyterapp.commands.execute('{FILTER_TOGGLE}')")
        page.locator(".jp-FileBrowser-filterBox").wait_for(timeout=bench_lite.WAIT_MS)
        page.wait_for_function(f"() => ({FILTER_PRESSED})()[1] === 'true'",
                               timeout=bench_lite.WAIT_MS)
        pressed_on = page.evaluate(FILTER_PRESSED)
        with_filter = page.evaluate(AXE_ELEMENTS)

    assert _serious(at_first_paint) == [], at_first_paint
    assert _serious(with_dialog) == [], with_dialog
    assert _serious(with_button) == [], with_button
    # Every rule, none left out.
    assert _serious(whole_page["violations"]) == [], whole_page["violations"]
    assert _serious(with_filter["violations"]) == [], with_filter["violations"]
    assert whole_page["passed"] > 20  # axe ran on the page
    # The toggle's state is on the inner button only, and follows the toggle.
    assert pressed_before == [None, "false"], pressed_before
    assert pressed_on == [None, "true"], pressed_on
