"""The web UI at /ui: a chat playground and an operations dashboard (static files in the
package, no build step), the JSON the dashboard polls (/ui/api/...) and the sampler that
feeds it from the server's or the router's own metrics."""
