package console

import "net/http"

// deadLetters is GET /dead-letters.
func (c *Console) deadLetters(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "deadletters", page{Title: "Dead letters", Nav: "dead-letters"})
}

// preview is POST /dead-letters/preview.
func (c *Console) preview(w http.ResponseWriter, r *http.Request) {
	c.render(w, r, http.StatusOK, "preview", page{Title: "Replay preview", Nav: "dead-letters"})
}
