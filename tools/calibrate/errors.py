"""The one error type of the calibrate tool; messages name the file, graph, key or node."""


class CalibrationError(Exception):
    """Calibration cannot go on: bad recipe, empty corpus, unusable bundle..."""
