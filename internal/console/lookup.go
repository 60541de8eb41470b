package console

import "net/http"

// lookup is GET /lookup.
func (c *Console) lookup(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "lookup", page{Title: "Look up a key", Nav: "lookup"})
}

// paste is POST /lookup.
func (c *Console) paste(w http.ResponseWriter, r *http.Request) { c.lookup(w, r) }

// clearMemo is POST /poison-memo/clear.
func (c *Console) clearMemo(w http.ResponseWriter, r *http.Request) {
	http.Redirect(w, r, "/lookup", http.StatusSeeOther)
}
