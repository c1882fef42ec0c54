"""The workbench by keyboard alone, and names for every control (what a screen reader says):
Tab reaches the pages and Enter switches them, a model loads and unloads without a mouse,
the API-key dialog is labelled and works from the keyboard, and no input, select, text area
or button on any page is nameless."""

from __future__ import annotations

import re

import httpx
from playwright.async_api import Page, expect

from tests.ui.conftest import Tab

MODEL = "whisper-base"  # loaded and unloaded again by keyboard
CONTROLS = "input:visible, select:visible, textarea:visible, button:visible"
# What the focused element is called: enough for links, buttons and labelled inputs here.
_FOCUSED_NAME = """() => {
  const e = document.activeElement;
  if (!e || e === document.body) return "";
  const label = e.getAttribute("aria-label") || (e.labels && e.labels[0] && e.labels[0].textContent);
  return (label || e.textContent || "").trim();
}"""


async def tab_to(page: Page, name: str, *, limit: int = 40, backwards: bool = False) -> int:
    """Press Tab (or Shift+Tab) until the element called `name` has the focus; how many presses."""
    seen = []
    for presses in range(1, limit + 1):
        await page.keyboard.press("Shift+Tab" if backwards else "Tab")
        focused = await page.evaluate(_FOCUSED_NAME)
        if focused == name:
            return presses
        seen.append(focused)
    raise AssertionError(f"{name!r} never got the focus; the focus went through {seen}")


async def test_tab_reaches_the_pages_and_enter_switches_them(tab: Tab) -> None:
    page = tab.page
    await tab.open("models")
    await expect(page.get_by_role("heading", name="Models", level=1)).to_be_visible()
    # From the top: the skip link, then Models, Playground, Metrics.
    assert await tab_to(page, "Metrics") == 4
    await page.keyboard.press("Enter")
    # The new page's heading has the focus: a screen reader says where the user is now.
    await expect(page.get_by_role("heading", name="Metrics", level=1)).to_be_focused()
    assert page.url.endswith("#metrics")
    await tab_to(page, "Playground", backwards=True)
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Playground", level=1)).to_be_focused()
    await expect(page.get_by_role("link", name="Playground")).to_have_attribute("aria-current", "page")
    await tab_to(page, "Models", backwards=True)
    await page.keyboard.press("Enter")
    await expect(page.get_by_role("heading", name="Models", level=1)).to_be_focused()
    # From the heading, Tab goes on into the page (the table's first model), not back to the top.
    first = page.get_by_role("button", name=re.compile(r"^Select ")).first
    await expect(first).to_be_visible(timeout=10_000)
    await page.keyboard.press("Tab")
    await expect(first).to_be_focused()


def luminance(rgb: tuple[int, int, int]) -> float:
    def channel(value: int) -> float:
        c = value / 255
        return c / 12.92 if c <= 0.03928 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (channel(v) for v in rgb)
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast(a: tuple[int, int, int], b: tuple[int, int, int]) -> float:
    high, low = sorted((luminance(a), luminance(b)), reverse=True)
    return (high + 0.05) / (low + 0.05)


def rgb(css: str) -> tuple[int, int, int]:
    found = re.search(r"rgba?\((\d+), (\d+), (\d+)", css)
    assert found, css
    return int(found.group(1)), int(found.group(2)), int(found.group(3))


async def test_the_focus_ring_stands_out_on_the_page_and_on_the_top_bar(tab: Tab) -> None:
    """WCAG 1.4.11: the focus indicator has ≥ 3:1 against what is around it. The ring is
    an outline outside a white box-shadow, so one of the two stands out on any ground."""
    page = tab.page
    await tab.open("models")
    await expect(page.get_by_role("heading", name="Models", level=1)).to_be_visible()
    await tab_to(page, "Models")  # a link on the dark top bar, by keyboard (:focus-visible)
    ring = await page.evaluate("""() => {
      const style = getComputedStyle(document.activeElement);
      return { outline: style.outlineColor, width: style.outlineWidth, shadow: style.boxShadow,
               bar: getComputedStyle(document.querySelector(".topbar")).backgroundColor,
               page: getComputedStyle(document.documentElement).backgroundColor };
    }""")
    outline, inner, bar, ground = rgb(ring["outline"]), rgb(ring["shadow"]), rgb(ring["bar"]), rgb(ring["page"])
    assert ring["width"] == "3px"
    assert contrast(inner, bar) >= 3  # on the dark bar: the white ring
    for light in (ground, (255, 255, 255)):  # on the page and on panels: the dark outline
        assert contrast(outline, light) >= 3, (ring, light)


async def test_a_model_loads_and_unloads_by_keyboard_alone(tab: Tab, ui_url: str) -> None:
    page = tab.page
    await tab.open("models")
    state = page.locator(f'tr[data-model="{MODEL}"] td[data-col="state"]')
    await expect(state).to_have_text("unloaded", timeout=10_000)
    try:
        await tab_to(page, f"Select {MODEL}")
        await page.keyboard.press("Enter")
        # The focus moves to the panel's heading, so Tab goes on into the load form.
        await expect(page.get_by_role("heading", name=MODEL, level=2)).to_be_focused()
        await tab_to(page, "beam_size", limit=5)
        await tab_to(page, "Load", limit=10)
        await page.keyboard.press("Enter")
        await expect(state).to_have_text("ready", timeout=90_000)
        await expect(page.get_by_role("button", name="Load", exact=True)).to_be_focused()  # still there
        await page.keyboard.press("Tab")
        await expect(page.get_by_role("button", name="Unload (drain)")).to_be_focused()
        await page.keyboard.press("Enter")
        await expect(state).to_have_text("unloaded", timeout=30_000)
    finally:
        async with httpx.AsyncClient(base_url=ui_url, timeout=60) as http:
            await http.post(f"/v1/admin/models/{MODEL}/unload", json={"drain": True})


async def test_the_key_dialog_is_labelled_and_works_by_keyboard(tab: Tab) -> None:
    page = tab.page
    await tab.open("models")
    key_button = page.get_by_role("button", name=re.compile(r"^API key"))
    await tab_to(page, "API key")
    await page.keyboard.press("Enter")
    dialog = page.get_by_role("dialog", name="API key")
    await expect(dialog).to_be_visible()
    await expect(dialog.get_by_label("Key")).to_be_focused()  # the modal takes the focus
    await page.keyboard.type("sk-keyboard")
    await tab_to(page, "Remember in this browser", limit=3)
    await page.keyboard.press("Space")
    await expect(dialog.get_by_label("Remember in this browser")).to_be_checked()
    await tab_to(page, "Use key", limit=3)
    await page.keyboard.press("Enter")
    await expect(dialog).to_be_hidden()
    await expect(key_button).to_have_text("API key (set)")
    assert await page.evaluate("() => localStorage.getItem('modelpool.key')") == "sk-keyboard"
    await key_button.focus()
    await page.keyboard.press("Enter")
    await expect(dialog).to_be_visible()
    await page.keyboard.press("Escape")
    await expect(dialog).to_be_hidden()
    await expect(key_button).to_have_text("API key (set)")  # Escape changes nothing
    await key_button.focus()
    await page.keyboard.press("Enter")
    await tab_to(page, "Forget key", limit=5)
    await page.keyboard.press("Enter")
    await expect(key_button).to_have_text("API key")
    assert await page.evaluate("() => localStorage.getItem('modelpool.key')") is None


async def nameless_controls(page: Page) -> list[str]:
    """The visible controls whose accessible name (Chromium's own computation) is empty."""
    nameless = []
    controls = page.locator(CONTROLS)
    for index in range(await controls.count()):
        control = controls.nth(index)
        try:
            await expect(control).to_have_accessible_name(re.compile(r"\S"), timeout=300)
        except AssertionError:
            nameless.append(await control.evaluate("(e) => e.outerHTML.slice(0, 160)"))
    return nameless


async def test_every_control_on_every_page_has_a_name(tab: Tab) -> None:
    page = tab.page
    found: dict[str, list[str]] = {}
    await tab.open("models")
    await page.get_by_role("button", name=f"Select {MODEL}").click()
    await expect(page.locator("#model-detail").get_by_label("beam_size")).to_be_visible()
    found["models"] = await nameless_controls(page)
    await tab.open("metrics")
    await expect(page.get_by_role("heading", name="Metrics", level=1)).to_be_visible()
    found["metrics"] = await nameless_controls(page)
    await tab.open("playground")
    await expect(page.get_by_role("heading", name="Playground", level=1)).to_be_visible()
    tabs = page.get_by_role("tab")
    await expect(tabs.first).to_be_visible(timeout=10_000)  # the sections are built once models are listed
    for index in range(await tabs.count()):  # every section the playground has
        await tabs.nth(index).click()
        found[f"playground {index}"] = await nameless_controls(page)
    assert {where: names for where, names in found.items() if names} == {}
