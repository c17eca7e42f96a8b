"""Rendering results: the report (``report``), its figures (``figures``), markdown tables and the HTML page
(``tables``, ``markdown_html``), the checks of a page as a reader opens it (``report_check``), and a committed
report's freshness (``freshness``)."""
