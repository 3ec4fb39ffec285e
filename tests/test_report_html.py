"""index.html as a person sees it: headless Chromium screenshots the page; the picture must hold text and figures.

Needs Debian's `chromium` (apt-get install chromium); marked integration, so the default suite does not run it."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from PIL import Image

from evalsuite.report.build import write_report
from tests.helpers import ALPHA_GSM8K, turn, write_run

pytestmark = pytest.mark.integration

FIGURE_BLUE = np.array([31, 119, 180])  # matplotlib's tab10 blue: the first method's colour, only in the figures


def screenshot(page, png, height: int = 9000) -> np.ndarray:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    if browser is None:
        pytest.skip("chromium is not installed (apt-get install chromium)")
    subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                    f"--window-size=1280,{height}", f"--screenshot={png}", page.as_uri()],
                   check=True, capture_output=True, timeout=120)
    return np.asarray(Image.open(png).convert("RGB")).astype(int)


def test_index_html_renders_tables_and_figures(tmp_path):
    general = write_run(tmp_path / "general", "gsm8k", {
        "alpha": ALPHA_GSM8K, "beta": {"s1": [turn([(3, 0), (3, 1)])], "s2": [turn([(3, 2)])]}})
    swe = write_run(tmp_path / "swe", "swebench", {"alpha": ALPHA_GSM8K})
    report = write_report([general, swe], tmp_path / "report", n_resamples=300)
    pixels = screenshot(report.out / "index.html", tmp_path / "shot.png")
    assert pixels.shape[0] >= 9000 and pixels.shape[1] >= 1280
    ink = (pixels.sum(axis=2) < 600).mean()  # anything clearly darker than the white page
    assert ink > 0.01, f"only {ink:.4f} of the page is not blank"
    colours = len(np.unique(pixels.reshape(-1, 3)[::7], axis=0))
    assert colours > 200, f"{colours} colours: text and anti-aliased figures would have many more"
    figure_blue = (np.abs(pixels - FIGURE_BLUE).sum(axis=2) < 30).sum()
    assert figure_blue > 2000, "the figures' lines and bars are missing: images did not load"


def test_latex_tables_compile_with_booktabs(tmp_path):
    pdflatex = shutil.which("pdflatex")
    if pdflatex is None:
        pytest.skip("pdflatex is not installed (apt-get install texlive-latex-recommended)")
    general = write_run(tmp_path / "general", "gsm8k", {"alpha": ALPHA_GSM8K})
    swe = write_run(tmp_path / "swe", "swebench", {"alpha": ALPHA_GSM8K})
    report = write_report([general, swe], tmp_path / "report", {"latex"}, n_resamples=200)
    tables = sorted((report.out / "tables").glob("*.tex"))
    document = ["\\documentclass{article}", "\\usepackage[T1]{fontenc}", "\\usepackage{booktabs}",
                "\\usepackage[landscape,margin=1cm]{geometry}", "\\begin{document}",
                *[f"\\input{{{t.as_posix()}}}\\clearpage" for t in tables], "\\end{document}"]
    (tmp_path / "all.tex").write_text("\n".join(document))
    result = subprocess.run([pdflatex, "-interaction=nonstopmode", "-halt-on-error", "all.tex"], cwd=tmp_path,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:]
    assert len(tables) == 13 and (tmp_path / "all.pdf").stat().st_size > 10_000
