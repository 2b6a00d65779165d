"""engines/ditto"""
