"""nbgrader preprocessor for feedback: a hidden-test cell keeps only the verdict of its outputs.

``ClearHiddenTests`` removes hidden test *source*, but a failing hidden test's traceback would
still quote it; this runs before it and reduces such a cell's error outputs to ``ename: evalue``
and drops its other outputs.
"""

from nbgrader.preprocessors import NbGraderPreprocessor


class ClearHiddenOutputs(NbGraderPreprocessor):
    def preprocess_cell(self, cell, resources, index):
        if cell.cell_type == "code" and "### BEGIN HIDDEN TESTS" in cell.source:
            kept = []
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error":
                    out["traceback"] = [f"{out.get('ename')}: {out.get('evalue')}"]
                    kept.append(out)
            cell["outputs"] = kept
        return cell, resources
