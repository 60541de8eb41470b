package console

import "net/http"

// overview is GET /.
func (c *Console) overview(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "overview", page{Title: "Overview", Nav: "overview"})
}
