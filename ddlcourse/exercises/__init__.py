"""Reference answers of the notebooks' exercises, one module per notebook (see ddlcourse.selfcheck)."""
