"""Episode tools: ``function:`` tools of a spec's file (``functions``), the built-in ``calculator`` and ``python``
tool (``python_tool``, and ``sailbox`` for ``environment.sandbox: sail``). The validation stage imports this
package.
"""
