"""retrytopics"""
