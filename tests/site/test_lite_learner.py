"""The exercise page as a learner meets it: one session in headless Chromium on the built
lite site (scripts/build_lite.py), offline (every host but 127.0.0.1 unresolvable), every
request recorded. One session, because each page load starts Python in the browser again.

1. Following a "Try it in your browser" link, the page shows at once what is loading:
   the loading view is painted before JupyterLab has started, and its status line goes
   from the editor to Python's start to ready (lite/loading.js).
2. The student id is asked in the page (no browser prompt), kept, shown on a button,
   and changed from that button: the next cell draws for the new id.
3. The notebook shows no unsaved change when it opens, nor once its kernel is ready.
   Run all on chapter 5's notebook as released reaches the end (every challenge's
   numbers printed, each check saying it is not answered); with the solutions' answers
   saved and run all, the draws are the given student's and the check cell prints the
   full score, the report ``kvlib_lite.check`` gives in CPython for the notebook the
   browser saved; one wrong answer (milliseconds), saved, and the check cell run again
   names that mistake.
4. After a reload, the saved work and the id are still there (the id is not asked
   again), and the check cell's result from before it is marked as old; run again, it
   is the current one (here the saved answers score more than the old result).
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

from kvlib_lite import check  # noqa: E402
from test_lite import (  # noqa: E402
    ASSIGNMENT,
    answer_names,
    numbers_output,
    solution_answers,
    wrong_answers,
)

from course.apps.selfcheck import format_report  # noqa: E402

NOTEBOOK = f"{ASSIGNMENT}/rate_limiting.ipynb"
OTHER = "01_kv_cache/kv_cache.ipynb"
STUDENT = "learner-one"
NEW_STUDENT = "learner-two"
WRONG_CELL = "answer_p95_wait_s"  # answered in milliseconds, a slip the check names
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

    assert AXE.is_file(), f"{AXE} is missing: run `make book` (npm ci installs axe-core)"
    site = build_lite.build()
    answers = solution_answers()
    data = check.assignment_data(ROOT)
    first_numbers = next(g for g in data[ASSIGNMENT]["rate_limiting"]["cells"]
                         if g.startswith("numbers_"))
    native: list[str] = []
    with bench_lite.browser_page(site) as (page, base, recorder):
        page.on("dialog", lambda dialog: (
            native.append(dialog.type) if dialog.type != "beforeunload" else None,
            dialog.accept()))
        page.add_init_script(RECORD_STATUS)
        page.goto(f"{base}lab/index.html?path={NOTEBOOK}", wait_until="commit")
        # 1. The loading view, on screen before JupyterLab exists; axe on the page as
        # first painted (the loading view alone), then on the id dialog.
        page.locator("#kvlib-loading").wait_for(state="visible", timeout=bench_lite.WAIT_MS)
        loading_text = page.locator("#kvlib-loading").inner_text()
        page.add_script_tag(path=str(AXE))
        at_first_paint = page.evaluate(AXE_RUN, None)
        page.locator("#kvlib-id-dialog[open]").wait_for(timeout=bench_lite.WAIT_MS)
        with_dialog = page.evaluate(AXE_RUN, PAGE_PARTS)
        # 2. The id, asked in the page once the editor is there.
        asked = bench_lite.answer_student_id(page, STUDENT)
        with_button = page.evaluate(AXE_RUN, PAGE_PARTS[1:])
        page.wait_for_function(bench_lite.KERNEL_IDLE, timeout=bench_lite.WAIT_MS)
        # 3. No unsaved change at open; the loading view is gone once ready.
        page.wait_for_function("() => !document.getElementById('kvlib-loading')",
                               timeout=bench_lite.WAIT_MS)
        dirty_at_open = page.evaluate(DIRTY)
        marks = bench_lite.timeline(page)
        statuses = page.evaluate("() => window.__statusLog")
        # axe on the whole page with the notebook open, then with the file filter open.
        whole_page = page.evaluate(AXE_ELEMENTS)
        pressed_before = page.evaluate(FILTER_PRESSED)
        _toggle_filter(page, "true")
        pressed_on = page.evaluate(FILTER_PRESSED)
        with_filter = page.evaluate(AXE_ELEMENTS)
        _toggle_filter(page, "false")

        # Run All on the notebook as released: it stops nowhere, every challenge prints its
        # numbers and its check says it is not answered yet; the check grades it 0.
        bench_lite.save_and_run_all(page)
        bench_lite.output_of(page, "self_check", r": 0 / \d+ points")
        blank = {gid: out for gid, _, out in bench_lite.cells(page)}
        # The solutions' answers, saved, run all: full marks, on the draws of the id given.
        bench_lite.set_sources(page, answers)
        bench_lite.save_and_run_all(page)
        report = bench_lite.output_of(page, "self_check", r": (\d+) / \1 points")
        drawn = next(out for gid, _, out in bench_lite.cells(page) if gid == first_numbers)
        saved_right = page.evaluate(
            "async (p) => (await window.jupyterapp.serviceManager.contents.get(p, "
            "{content: true, type: 'notebook'})).content", NOTEBOOK)
        # One wrong answer, the notebook saved again, the check cell run again.
        bench_lite.set_sources(page, {WRONG_CELL: wrong_answers()[WRONG_CELL]})
        bench_lite.save_and_run_cell(page, "self_check")
        wrong_report = bench_lite.output_of(page, "self_check", r"missed")

        # 4. The right answer saved but not checked; after a reload the check's result
        # from before it is marked old, and the work and the id are still there.
        bench_lite.set_sources(page, {WRONG_CELL: answers[WRONG_CELL]})
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
        kept = {gid: src for gid, src, _ in bench_lite.cells(page) if gid in answers}
        shown_id = page.locator("#kvlib-id-button").get_attribute("data-student-id")
        asked_again = page.locator("#kvlib-id-dialog[open]").count()
        stored_id = page.evaluate(
            "async () => (await window.jupyterapp.serviceManager.contents.get("
            "'kvlib_student_id.txt', {content: true})).content")
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
    # axe-core: the page's own parts, then the whole page with every rule, none left out.
    assert _serious(at_first_paint) == [], at_first_paint
    assert _serious(with_dialog) == [], with_dialog
    assert _serious(with_button) == [], with_button
    assert _serious(whole_page["violations"]) == [], whole_page["violations"]
    assert _serious(with_filter["violations"]) == [], with_filter["violations"]
    assert whole_page["passed"] > 20  # axe ran on the page
    # The filter toggle's state is on the inner button only, and follows the toggle.
    assert pressed_before == [None, "false"], pressed_before
    assert pressed_on == [None, "true"], pressed_on
    # 2. The id: what it is for, how to change it; kept, not asked again, and changed.
    assert "numbers" in asked and "change it later" in asked
    assert stored_id.strip() == STUDENT
    assert shown_id == STUDENT and asked_again == 0
    assert prefilled == STUDENT
    assert drawn_for.strip() == NEW_STUDENT
    # The notebook as released runs to its end: every challenge's numbers, and each check
    # saying it is not answered yet.
    for challenge in (g[len("answer_"):] for g in answers):
        assert blank[f"numbers_{challenge}"].strip(), challenge
        assert "is not answered yet" in blank[f"check_{challenge}"], challenge
    # The numbers were drawn for the id given, which draws other numbers than the default.
    assert drawn.strip() == numbers_output(STUDENT).strip()
    assert numbers_output(STUDENT) != numbers_output("self-study")
    # The browser's report is kvlib_lite.check's, in CPython, on the notebook it saved.
    expected = check.grade_notebook(saved_right, STUDENT, data)
    assert expected.score == expected.max_score > 0
    assert format_report(expected) in report
    assert f"{expected.score:g} / {expected.max_score:g} points" in report
    # The named mistake for the wrong answer, the rest still right.
    line = next(li for li in wrong_report.splitlines()
                if li.strip().startswith(answer_names()[WRONG_CELL]))
    assert "missed" in line and "milliseconds" in line
    assert wrong_report.count("missed") == 1
    # 3. Nothing unsaved before any edit, nor after the reload; the saved work kept.
    assert dirty_at_open is False and dirty_after_reload is False
    assert kept == answers
    # 4. The old result is marked old, then replaced by the current one.
    assert restored.startswith(OLD_NOTE) and "missed" in restored
    assert OLD_NOTE not in current and "missed" not in current
    # 5. The link's notebook only, and a reload restores it.
    assert tabs_after_link == [OTHER]
    assert tabs_after_reload == [OTHER]


def _toggle_filter(page: Any, pressed: str) -> None:
    """Toggle the file browser's filter box; wait until its inner button says ``pressed``."""
    import bench_lite

    page.evaluate(f"window.jupyterapp.commands.execute('{FILTER_TOGGLE}')")
    if pressed == "true":
        page.locator(".jp-FileBrowser-filterBox").wait_for(timeout=bench_lite.WAIT_MS)
    page.wait_for_function(f"() => ({FILTER_PRESSED})()[1] === '{pressed}'",
                           timeout=bench_lite.WAIT_MS)


def _serious(violations: list[list[Any]]) -> list[list[Any]]:
    return [v for v in violations if v[0] in ("critical", "serious")]
