"""glm-dsa (GLM-5.x): absorbed MLA + DSA lightning indexer + NextN."""
