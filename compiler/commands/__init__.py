"""Commands built on many estimates: fit, sweep, diff, check, validate, chart and the HTML report."""
