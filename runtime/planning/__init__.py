"""What a run will cost, before it starts and step by step (``cost``). The validation stage imports this
package.
"""
