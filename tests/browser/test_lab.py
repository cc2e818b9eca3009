"""The notebooks as a researcher meets them: opened in JupyterLab in a real browser, every cell run
from the Run menu, no cell showing an error, every figure rendered, progress bars drawn as widgets.

The browser tier (marked ``browser``): `make test-browser`, the last step of .ci/run. Screenshots
of each notebook and of each figure as the browser shows it go to build/browser/.
"""

from __future__ import annotations

import time

import pytest

from .conftest import NOTEBOOKS, SCREENSHOTS

pytestmark = pytest.mark.browser

#: The figures each notebook shows and exports (tests/runner/test_notebooks.py lists all of them).
FIGURES = {
    "01_quickstart": ["quickstart_recall"],
    "02_scoring": ["scoring_byte_budget", "scoring_network_bytes", "scoring_complexity", "scoring_peers", "scoring_frontier", "scoring_fusion_cost",
                   "scoring_roofline"],
}
#: The notebooks whose cells draw a tqdm.auto progress bar.
PROGRESS_BARS = {"01_quickstart"}
PAGE_LOAD_S = 120
RUN_ALL_S = 540

#: The open notebook as JupyterLab's model holds it (window.jupyterapp: --LabApp.expose_app_in_browser).
NOTEBOOK_STATE = """
const widget = window.jupyterapp && window.jupyterapp.shell.currentWidget;
if (!widget || !widget.content || !widget.content.model || !widget.sessionContext) return null;
const model = widget.content.model, cells = [];
for (let i = 0; i < model.cells.length; i++) {
  const cell = model.cells.get(i);
  const code = cell.type === 'code';
  cells.push({type: cell.type, source: cell.sharedModel.getSource(),
              count: code ? cell.executionCount : null, outputs: code ? cell.outputs.toJSON() : []});
}
return {path: widget.context.path, status: widget.sessionContext.kernelDisplayStatus,
        kernel: widget.sessionContext.kernelDisplayName, cells: cells};
"""


def wait_for(description, condition, timeout, poll=0.5):
    """condition() until it returns something truthy (returned), else fail naming ``description``."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {description}", pytrace=False)
        time.sleep(poll)


def open_in_lab(driver, lab, path: str) -> None:
    driver.get(f"{lab.url}/lab/tree/{path}?token={lab.token}")


def click_menu(driver, menu: str, item: str) -> None:
    """Click a top menu (``Run``) and one of its items by its label, as a user does."""
    from selenium.webdriver.common.by import By

    bar = wait_for(f"the {menu} menu", lambda: [e for e in driver.find_elements(By.CSS_SELECTOR, ".lm-MenuBar-item")
                                                 if e.text.strip() == menu], PAGE_LOAD_S)
    bar[0].click()
    entry = wait_for(f"{menu} > {item}", lambda: [e for e in driver.find_elements(By.CSS_SELECTOR, ".lm-Menu-item")
                                                   if e.text.split("\n")[0].strip() == item], 10)
    entry[0].click()


def errors_in(state) -> list[str]:
    return [f"cell {i}: {o.get('ename')}: {o.get('evalue')}" for i, cell in enumerate(state["cells"])
            for o in cell["outputs"] if o.get("output_type") == "error"]


def finished(state) -> bool:
    code = [c for c in state["cells"] if c["type"] == "code" and c["source"].strip()]
    return state["status"] == "idle" and all(c["count"] is not None for c in code)


def test_lab_opens_on_the_notebooks_folder(browser, lab):
    from selenium.webdriver.common.by import By

    browser.get(f"{lab.url}/?token={lab.token}")  # `make lab`'s landing page
    def notebooks_listed():  # the listing renders in steps: wait until every notebook is in it
        names = [e.text for e in browser.find_elements(By.CSS_SELECTOR, ".jp-DirListing-itemText")
                 if e.text.endswith(".ipynb")]
        return names if len(names) >= len(NOTEBOOKS) else None

    listed = wait_for(f"the {len(NOTEBOOKS)} notebooks in the file browser", notebooks_listed, PAGE_LOAD_S)
    assert sorted(listed) == [f"{name}.ipynb" for name in NOTEBOOKS]
    assert browser.current_url.split("?")[0].endswith("/lab/tree/notebooks")
    browser.save_screenshot(str(SCREENSHOTS / "00_notebooks_folder.png"))


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_notebook_runs_in_the_browser_without_errors_and_shows_its_figures(browser, lab, name):
    from selenium.webdriver.common.by import By

    open_in_lab(browser, lab, f"notebooks/{name}.ipynb")

    def opened():
        state = browser.execute_script(NOTEBOOK_STATE)
        return state if state and state["path"] == f"notebooks/{name}.ipynb" and state["status"] == "idle" else None

    state = wait_for(f"{name}.ipynb open with an idle kernel", opened, PAGE_LOAD_S)
    assert not any(c["count"] is not None for c in state["cells"] if c["type"] == "code"), "committed with outputs"
    click_menu(browser, "Run", "Run All Cells")

    def done():
        state = browser.execute_script(NOTEBOOK_STATE)
        return state if errors_in(state) or finished(state) else None

    state = wait_for(f"every cell of {name}.ipynb to run", done, RUN_ALL_S, poll=1.0)
    browser.execute_script("document.querySelector('.jp-WindowedPanel-outer').scrollTop = 0")
    browser.save_screenshot(str(SCREENSHOTS / f"{name}.png"))

    # no cell shows an error: the model holds none, and no output area renders a traceback
    assert not errors_in(state), f"{name}: {errors_in(state)}\n{lab.log_tail()}"
    assert finished(state)
    page = browser.find_element(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook").text
    assert "Traceback" not in page and "IProgress not found" not in page

    # every figure is rendered: one image output per figure, each decoded by the browser
    shown = sum("image/png" in o.get("data", {}) for c in state["cells"] for o in c["outputs"])
    assert shown == len(FIGURES[name]), f"{name}: {shown} image outputs"
    images = browser.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .jp-OutputArea-output img")
    assert len(images) == shown
    for index, image in enumerate(images):
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", image)
        size = browser.execute_script("return [arguments[0].complete, arguments[0].naturalWidth, "
                                      "arguments[0].getBoundingClientRect().width]", image)
        assert size[0] and size[1] > 300 and size[2] > 300, f"{name}: image {index} not rendered: {size}"
        image.screenshot(str(SCREENSHOTS / f"{name}_figure_{index}.png"))
    # ... and exported where the notebook says, relative to the repository root (the kernel moved there)
    for figure in FIGURES[name]:
        for ext in ("png", "svg"):
            assert (lab.root / "figures" / f"{figure}.{ext}").stat().st_size > 0, f"{name}: {figure}.{ext}"

    # progress bars are widgets in JupyterLab (ipywidgets and its JupyterLab renderer)
    if name in PROGRESS_BARS:
        widgets = [o for c in state["cells"] for o in c["outputs"]
                   if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
        assert widgets, f"{name}: no widget output"
        bars = browser.find_elements(By.CSS_SELECTOR, ".jp-NotebookPanel:not(.lm-mod-hidden) .widget-hprogress")
        assert bars, f"{name}: the progress bar is not drawn as a widget"
        output = bars[0].find_element(By.XPATH, "./ancestor::div[contains(@class, 'jp-OutputArea-output')]")
        assert "100%" in output.text, output.text
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", output)
        output.screenshot(str(SCREENSHOTS / f"{name}_progress_bar.png"))
