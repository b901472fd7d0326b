"""MLflow: the store (every MLflow call), the tracking callback, model export and the pyfunc champion."""
