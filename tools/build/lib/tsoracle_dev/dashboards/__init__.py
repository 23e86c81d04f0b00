"""The Grafana dashboards and the PrometheusRule alerts, generated from one list of panels."""
