import os
import sys

# Tests import each other's input builders (test_ops_delta uses test_reference_delta's).
sys.path.insert(0, os.path.dirname(__file__))
